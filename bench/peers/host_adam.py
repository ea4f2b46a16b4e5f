#!/usr/bin/env python3
"""The host AdamW step against DeepSpeed's DeepSpeedCPUAdam and torch's fused CPU AdamW, interleaved.

    python3 -m venv V && V/bin/pip install torch deepspeed ninja
    OMP_NUM_THREADS=2 V/bin/python bench/peers/host_adam.py \
        --zerotk build/default/bench/kernels/zerotk_bench_kernels [--threads 2] [--rounds 5]

Each round runs, one after the other: zerotk's BM_fused_adamw_fp32 (one repetition of the C++ benchmark,
which also measures its read-modify-write bound right before itself), then DeepSpeedCPUAdam's step, then
torch.optim.AdamW(fused=True)'s step, on the same working set: 64 Mi fp32 params with fp32 grads, m and v
(1 GiB; 28 B per param counted, as the C++ side counts). The peers' figure per round is the median of 3
timed steps after one untimed step. The ratios are taken per round and their median printed, so a load
swing hits all three alike. DeepSpeedCPUAdam is built by DeepSpeed on first use (a few minutes, cached).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

PARAMS = 64 << 20


def zerotk_round(binary):
    out = subprocess.run([binary, "--benchmark_filter=^BM_fused_adamw_fp32/", "--benchmark_repetitions=1",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    b = [x for x in json.loads(out)["benchmarks"] if x.get("run_type") == "iteration"][0]
    return b["G_items_per_s"], b.get("vs_bound", float("nan"))


def make_optimizer(kind):
    p = torch.full((PARAMS,), 0.5).requires_grad_(True)
    p.grad = torch.full_like(p, 0.01)
    if kind == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01, adamw_mode=True)
    else:
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    opt.step()  # state allocated outside the timing
    return opt


def peer_round(opt):
    times = []
    with torch.no_grad():
        for _ in range(3):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
    return PARAMS / statistics.median(times) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zerotk", required=True, help="path of zerotk_bench_kernels")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    peers = {}
    for kind in ("deepspeed", "torch_fused"):
        try:
            peers[kind] = make_optimizer(kind)
        except Exception as e:  # a missing peer is reported, never silently dropped
            print(f"peer {kind} unavailable: {type(e).__name__}: {e}", file=sys.stderr)
    print(f"torch {torch.__version__}, {a.threads} threads, {a.rounds} rounds, {PARAMS} params")
    rows = []
    for r in range(a.rounds):
        z, vs_bound = zerotk_round(a.zerotk)
        row = {"zerotk": z, "vs_bound": vs_bound}
        for kind, opt in peers.items():
            row[kind] = peer_round(opt)
        rows.append(row)
        print(f"round {r}: " + "  ".join(f"{k}={v:.4g}" for k, v in row.items()), flush=True)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print("median G params/s: " + "  ".join(f"{k}={v:.4g}" for k, v in med.items()))
    for kind in peers:
        ratios = [row["zerotk"] / row[kind] for row in rows]
        print(f"zerotk / {kind}: median {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")
    return 0 if len(peers) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
