#!/usr/bin/env python3
"""Writes the optimizer golden fixtures of zerotk's tests (tests/golden/optim_*.golden).

Adam (L2) and AdamW trajectories come from torch.optim.Adam / torch.optim.AdamW (an implementation
independent of zerotk). LAMB has no torch optimizer; its trajectory comes from a float64 numpy
reference written below from SEMANTICS.md section 3. The C++ tests need neither torch nor numpy.

Usage (Debian: apt-get install python3-torch python3-numpy):
    python3 tests/golden/make_golden.py            # rewrites the fixtures next to this script

File format (little-endian), one file per case:
    text header, one "key value..." per line, ending with a line "end":
        zerotk-golden 1
        case <name>
        optimizer adam|adamw|lamb
        steps <T>
        tensors <K> <numel_0> ... <numel_K-1>
        groups <G>
        group <g> lr <x> beta1 <x> beta2 <x> eps <x> weight_decay <x> bias_correction <0|1> min_coeff <x> max_coeff <x>
        tensor_group <group of tensor 0> ... <group of tensor K-1>
        end
    then float32 arrays, tensors concatenated in order (N = sum of numels):
        p0[N]  grads[T][N]  params[T][N] (after each step)  m[N]  v[N] (after the last step)
Hyper-parameters are float32 values printed exactly (repr of the float64 that equals them): torch
receives these exact values, so both sides start from the same numbers.
"""

import os
import sys

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("make_golden.py needs torch (Debian: apt-get install python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
NUMELS = [1, 3, 17, 43]  # 64 parameters; sizes cover 1 element and lengths that are not multiples of 8/16
STEPS = 100


def f32(x):
    """The float64 that equals float32(x), so Python, torch and C++ agree on every hyper-parameter."""
    return float(np.float32(x))


def make_data(seed, init_scales, grad_spread):
    """Initial parameters per tensor and gradients per step; gradient magnitudes vary per step over
    10^[-grad_spread, 1] so that both tiny and large moments appear."""
    rng = np.random.default_rng(seed)
    p0 = [(rng.standard_normal(n) * s).astype(np.float32) for n, s in zip(NUMELS, init_scales)]
    grads = []
    for _ in range(STEPS):
        mag = 10.0 ** rng.uniform(-grad_spread, 1.0)
        grads.append([(rng.standard_normal(n) * mag).astype(np.float32) for n in NUMELS])
    return p0, grads


def run_torch(kind, p0, grads, groups, tensor_group):
    params = [torch.tensor(p, dtype=torch.float32).clone().requires_grad_(True) for p in p0]
    param_groups = []
    for g, h in enumerate(groups):
        members = [params[i] for i in range(len(params)) if tensor_group[i] == g]
        param_groups.append({"params": members, "lr": h["lr"], "betas": (h["beta1"], h["beta2"]),
                             "eps": h["eps"], "weight_decay": h["weight_decay"]})
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    opt = cls(param_groups, foreach=False)
    traj = []
    for step in range(STEPS):
        for p, g in zip(params, grads[step]):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        traj.append([p.detach().numpy().copy() for p in params])
    m = [opt.state[p]["exp_avg"].numpy().copy() for p in params]
    v = [opt.state[p]["exp_avg_sq"].numpy().copy() for p in params]
    return traj, m, v


def run_lamb(p0, grads, groups, tensor_group):
    """LAMB per SEMANTICS.md section 3, in float64:
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m / (sqrt(v) + eps) + wd p;
    ratio = ||p|| / ||u|| clamped to [min_coeff, max_coeff], 1 if either norm is 0;
    p -= step_size * ratio * u, step_size = lr sqrt(1-b2^t) / (1-b1^t) (lr without bias correction)."""
    p = [x.astype(np.float64) for x in p0]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    traj = []
    for step in range(STEPS):
        t = step + 1
        for i in range(len(p)):
            h = groups[tensor_group[i]]
            g = grads[step][i].astype(np.float64)
            m[i] = h["beta1"] * m[i] + (1.0 - h["beta1"]) * g
            v[i] = h["beta2"] * v[i] + (1.0 - h["beta2"]) * g * g
            u = m[i] / (np.sqrt(v[i]) + h["eps"]) + h["weight_decay"] * p[i]
            pn, un = np.linalg.norm(p[i]), np.linalg.norm(u)
            ratio = 1.0 if pn == 0.0 or un == 0.0 else min(max(pn / un, h["min_coeff"]), h["max_coeff"])
            step_size = h["lr"]
            if h["bias_correction"]:
                step_size = h["lr"] * np.sqrt(1.0 - h["beta2"] ** t) / (1.0 - h["beta1"] ** t)
            p[i] = p[i] - step_size * ratio * u
        traj.append([x.astype(np.float32) for x in p])
    return traj, [x.astype(np.float32) for x in m], [x.astype(np.float32) for x in v]


def hyper(lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, bias_correction=1, min_coeff=0.01, max_coeff=10.0):
    return {"lr": f32(lr), "beta1": f32(beta1), "beta2": f32(beta2), "eps": f32(eps),
            "weight_decay": f32(weight_decay), "bias_correction": bias_correction,
            "min_coeff": f32(min_coeff), "max_coeff": f32(max_coeff)}


def write_case(name, kind, groups, tensor_group, p0, grads, traj, m, v):
    lines = ["zerotk-golden 1", f"case {name}", f"optimizer {kind}", f"steps {STEPS}",
             "tensors %d %s" % (len(NUMELS), " ".join(str(n) for n in NUMELS)), f"groups {len(groups)}"]
    for g, h in enumerate(groups):
        lines.append("group %d lr %r beta1 %r beta2 %r eps %r weight_decay %r bias_correction %d min_coeff %r max_coeff %r"
                     % (g, h["lr"], h["beta1"], h["beta2"], h["eps"], h["weight_decay"], h["bias_correction"],
                        h["min_coeff"], h["max_coeff"]))
    lines.append("tensor_group " + " ".join(str(g) for g in tensor_group))
    lines.append("end")
    cat = lambda arrays: np.concatenate(arrays).astype("<f4").tobytes()
    with open(os.path.join(HERE, f"optim_{name}.golden"), "wb") as f:
        f.write(("\n".join(lines) + "\n").encode())
        f.write(cat(p0))
        for s in range(STEPS):
            f.write(cat(grads[s]))
        for s in range(STEPS):
            f.write(cat(traj[s]))
        f.write(cat(m))
        f.write(cat(v))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)

    # AdamW, one group, decay on everything.
    p0, grads = make_data(1, [1.0, 1.0, 0.5, 0.1], 4)
    groups, tg = [hyper(1e-3, weight_decay=0.01)], [0, 0, 0, 0]
    write_case("adamw", "adamw", groups, tg, p0, grads, *run_torch("adamw", p0, grads, groups, tg))

    # Adam with L2 decay (adam_w_mode = false), other betas and eps.
    p0, grads = make_data(2, [1.0, 1.0, 0.5, 0.1], 4)
    groups, tg = [hyper(2e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05)], [0, 0, 0, 0]
    write_case("adam_l2", "adam", groups, tg, p0, grads, *run_torch("adam", p0, grads, groups, tg))

    # AdamW with two groups: tensors 0 and 2 decay, tensors 1 and 3 ("biases, norms") excluded, other lr.
    p0, grads = make_data(3, [1.0, 0.0, 0.5, 0.1], 3)
    groups, tg = [hyper(1e-3, weight_decay=0.1), hyper(3e-3, weight_decay=0.0)], [0, 1, 0, 1]
    write_case("adamw_groups", "adamw", groups, tg, p0, grads, *run_torch("adamw", p0, grads, groups, tg))

    # LAMB, two groups; tensor 1 starts at zero (||p|| = 0: ratio 1), tensor 3 is large (ratio clamps at max).
    p0, grads = make_data(4, [1.0, 0.0, 0.05, 100.0], 3)
    groups = [hyper(1e-2, weight_decay=0.01, min_coeff=0.01, max_coeff=10.0),
              hyper(5e-3, beta1=0.85, beta2=0.995, eps=1e-6, weight_decay=0.0, min_coeff=0.05, max_coeff=5.0)]
    tg = [0, 1, 0, 0]
    write_case("lamb", "lamb", groups, tg, p0, grads, *run_lamb(p0, grads, groups, tg))

    # LAMB without bias correction.
    p0, grads = make_data(5, [1.0, 0.3, 0.05, 2.0], 2)
    groups, tg = [hyper(2e-3, weight_decay=0.02, bias_correction=0)], [0, 0, 0, 0]
    write_case("lamb_nobc", "lamb", groups, tg, p0, grads, *run_lamb(p0, grads, groups, tg))


if __name__ == "__main__":
    main()
