#!/usr/bin/env python3
"""Peer numbers for bench/kernels (Debian's python3-torch), in the units zerotk_bench_kernels prints.

    OMP_NUM_THREADS=2 python3 bench/peers/torch_kernels.py [--threads 2] [--reps 5]
        [--zerotk build/<dir>/bench/kernels/zerotk_bench_kernels]

With --zerotk the C++ benchmark runs first in the same invocation (5 repetitions, medians) and a table
of zerotk / torch ratios follows. Working sets match the C++ side: 64 Mi params for AdamW (p, g, m, v
fp32 = 1 GiB), 1 GiB of fp32 for casts, flatten of 16 x 64 MiB and of 10,000 small tensors.
Bytes counted = read + written once each (AdamW: 28 B/param, as the C++ benchmark counts).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

PARAMS = 64 << 20
CAST = 256 << 20


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_adamw(reps, foreach, tensors, fused=False):
    sizes = [PARAMS // tensors] * tensors
    sizes[-1] += PARAMS - sum(sizes)
    params = [torch.full((n,), 0.5).requires_grad_(True) for n in sizes]
    for p in params:
        p.grad = torch.full_like(p, 0.01)
    if fused:  # torch >= 2.4 has a fused AdamW for CPU tensors
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    else:
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
    opt.step()  # allocate the state outside the timing
    with torch.no_grad():
        t = median_time(opt.step, reps)
    return {"G_params_per_s": PARAMS / t / 1e9, "GB_per_s": 28.0 * PARAMS / t / 1e9, "ms": t * 1e3}


def bench_cast(reps, src, dst):
    x = torch.full((CAST,), 0.5, dtype=src)
    out = torch.empty(CAST, dtype=dst)
    t = median_time(lambda: out.copy_(x), reps)
    t_to = median_time(lambda: x.to(dst), reps)  # allocates, as users write it
    b = CAST * (x.element_size() + out.element_size())
    return {"GB_per_s": b / t / 1e9, "GB_per_s_to": b / t_to / 1e9, "ms": t * 1e3}


def bench_flatten(reps, count, each):
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    ts = [torch.full((n,), 0.5) for n in each(count)]
    total = sum(t.numel() for t in ts)
    t = median_time(lambda: _flatten_dense_tensors(ts), reps)
    flat = _flatten_dense_tensors(ts)
    t_un = median_time(lambda: [a.copy_(b) for a, b in zip(ts, _unflatten_dense_tensors(flat, ts))], reps)
    src = torch.full((total,), 0.5)
    dst = torch.empty(total)
    t_copy = median_time(lambda: dst.copy_(src), reps)
    return {"GB_per_s": 8.0 * total / t / 1e9, "unflatten_GB_per_s": 8.0 * total / t_un / 1e9,
            "overhead_us_per_tensor": (t - t_copy) * 1e6 / count, "ms": t * 1e3}


def has_fused_cpu_adamw():
    try:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        print("torch %s has no fused AdamW for CPU tensors: that peer is left out" % torch.__version__)
        return False


def run_zerotk(binary, reps):
    out = subprocess.run([binary, f"--benchmark_repetitions={reps}", "--benchmark_report_aggregates_only=true",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        res[b["run_name"].split("/")[0]] = b
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--zerotk", help="path of zerotk_bench_kernels to run first")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    z = run_zerotk(a.zerotk, a.reps) if a.zerotk else None
    if z:
        print("zerotk (median of %d)" % a.reps)
        for name, b in z.items():
            keys = [k for k in ("G_items_per_s", "GB_per_s", "vs_bound", "overhead_us", "overhead_us_per_tensor") if k in b]
            print("  %-40s %s" % (name, "  ".join("%s=%.4g" % (k, b[k]) for k in keys)))

    print(f"torch {torch.__version__}, {a.threads} threads (median of {a.reps})")
    peers = {
        "adamw_foreach_1": bench_adamw(a.reps, True, 1),
        "adamw_foreach_1000": bench_adamw(a.reps, True, 1000),
        **({"adamw_fused_1": bench_adamw(a.reps, False, 1, fused=True)} if has_fused_cpu_adamw() else {}),
        "adamw_loop_1000": bench_adamw(a.reps, False, 1000),
        "cast_fp32_to_fp16": bench_cast(a.reps, torch.float32, torch.float16),
        "cast_fp32_to_bf16": bench_cast(a.reps, torch.float32, torch.bfloat16),
        "cast_fp16_to_fp32": bench_cast(a.reps, torch.float16, torch.float32),
        "flatten_large_16": bench_flatten(a.reps, 16, lambda c: [CAST // c] * c),
        "flatten_small_10000": bench_flatten(a.reps, 10000, lambda c: [64 + (t * 7919) % 960 for t in range(c)]),
    }
    for name, r in peers.items():
        print("  %-40s %s" % (name, "  ".join("%s=%.4g" % kv for kv in r.items())))

    if z:
        print("ratios zerotk / torch")
        pairs = [("BM_fused_adamw_fp32", "G_items_per_s", "adamw_foreach_1", "G_params_per_s"),
                 ("BM_fused_adamw_fp32", "G_items_per_s", "adamw_fused_1", "G_params_per_s"),
                 ("BM_multi_tensor_adamw_1000", "G_items_per_s", "adamw_foreach_1000", "G_params_per_s"),
                 ("BM_cast_fp32_to_fp16", "GB_per_s", "cast_fp32_to_fp16", "GB_per_s"),
                 ("BM_cast_fp32_to_bf16", "GB_per_s", "cast_fp32_to_bf16", "GB_per_s"),
                 ("BM_cast_fp16_to_fp32", "GB_per_s", "cast_fp16_to_fp32", "GB_per_s"),
                 ("BM_flatten_large", "GB_per_s", "flatten_large_16", "GB_per_s"),
                 ("BM_flatten_small_10000", "GB_per_s", "flatten_small_10000", "GB_per_s")]
        for zn, zk, pn, pk in pairs:
            if zn in z and pn in peers:
                print("  %-40s %.2fx" % (zn + " / " + pn, z[zn][zk] / peers[pn][pk]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
