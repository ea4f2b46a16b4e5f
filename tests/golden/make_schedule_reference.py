#!/usr/bin/env python3
"""Generates tests/golden/lr_schedule_reference.txt by running DeepSpeed's own LR schedules.

The script loads deepspeed/runtime/lr_schedules.py from a DeepSpeed source checkout (no
installation, no torch: the names it imports are stubbed), builds each schedule on a stub
optimizer exactly as the DeepSpeed engine does, and records what the optimizer sees: its lr and
betas right after construction (the values the first optimizer step uses, it = -1) and after
every scheduler.step(). tests/optim/test_schedulers.cpp compares zerotk's schedules against it.

    python3 tests/golden/make_schedule_reference.py --deepspeed PATH/TO/DeepSpeed [--out FILE]

File format ('#' lines are comments):
    schedule <id> <Type> <optimizer_lr> <key>=<value> ...     (DeepSpeed parameter names; values as JSON)
    <it> <lr> <beta1 or -> <beta2 or ->                      (one line per recorded iteration)
Numbers are printed with repr() (shortest round trip).
"""

import argparse
import importlib.util
import json
import pathlib
import sys
import types


def load_deepspeed_lr_schedules(root):
    torch = types.ModuleType("torch")
    optim = types.ModuleType("torch.optim")

    class Optimizer:  # stands in for torch.optim.Optimizer in isinstance checks
        pass

    optim.Optimizer = Optimizer
    torch.optim = optim
    torch.tensor = lambda *a, **k: (_ for _ in ()).throw(AssertionError("tensor lr not expected"))
    torch.is_tensor = lambda x: False
    ds = types.ModuleType("deepspeed")
    ds.__path__ = []
    utils = types.ModuleType("deepspeed.utils")

    class _QuietLogger:
        def warning(self, *a, **k):
            pass

        info = warn = warning

    utils.logger = _QuietLogger()
    sys.modules.update({"torch": torch, "torch.optim": optim, "deepspeed": ds, "deepspeed.utils": utils})
    path = pathlib.Path(root) / "deepspeed" / "runtime" / "lr_schedules.py"
    spec = importlib.util.spec_from_file_location("ds_lr_schedules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, Optimizer


# (type, optimizer lr, params, iterations to record beyond the dense range, dense range end)
CASES = [
    ("WarmupLR", 0.003, {"warmup_num_steps": 10}, 40),
    ("WarmupLR", 0.003, {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 7,
                         "warmup_type": "linear"}, 30),
    ("WarmupLR", 0.003, {"warmup_min_lr": 0.1, "warmup_max_lr": 0.3, "warmup_num_steps": 1}, 10),
    ("WarmupDecayLR", 0.003, {"total_num_steps": 50, "warmup_num_steps": 10}, 80),
    ("WarmupDecayLR", 0.003, {"total_num_steps": 40, "warmup_min_lr": 1e-6, "warmup_max_lr": 2e-3,
                              "warmup_num_steps": 8, "warmup_type": "linear"}, 60),
    ("WarmupDecayLR", 0.003, {"total_num_steps": 3, "warmup_num_steps": 5, "warmup_type": "linear"}, 20),
    ("WarmupCosineLR", 0.02, {"total_num_steps": 40, "warmup_num_steps": 10, "warmup_min_ratio": 0.1}, 70),
    ("WarmupCosineLR", 0.02, {"total_num_steps": 30, "warmup_num_steps": 6, "warmup_type": "linear",
                              "cos_min_ratio": 0.05}, 50),
    ("WarmupCosineLR", 0.02, {"total_num_steps": 3, "warmup_num_steps": 3, "warmup_type": "linear"}, 12),
    ("OneCycle", 0.001, {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10}, 50),
    ("OneCycle", 0.001, {"cycle_min_lr": 2e-4, "cycle_max_lr": 5e-3, "cycle_first_step_size": 7,
                         "cycle_second_step_size": 3, "decay_lr_rate": 0.5, "decay_step_size": 4,
                         "decay_mom_rate": 0.1, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}, 40),
    ("OneCycle", 0.001, {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 9,
                         "cycle_second_step_size": 6, "cycle_first_stair_count": 3,
                         "cycle_second_stair_count": 2}, 40),
    ("OneCycle", 0.001, {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
                         "cycle_second_step_size": 0, "decay_lr_rate": 0.25, "decay_step_size": 2}, 20),
    ("OneCycle", 0.001, {"cycle_min_lr": 3e-4, "cycle_max_lr": 3e-3, "cycle_first_step_size": 4,
                         "cycle_momentum": False, "cycle_first_stair_count": 2}, 20),
    ("LRRangeTest", 0.001, {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5,
                            "lr_range_test_step_rate": 0.5}, 30),
    ("LRRangeTest", 0.001, {"lr_range_test_min_lr": 2e-5, "lr_range_test_step_size": 4,
                            "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": True}, 30),
]
# Far iterations, reached with DeepSpeed's step(batch_iteration) after the dense range.
FAR = [1000, 1017, 123456, 10**7]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deepspeed", required=True, help="root of a DeepSpeed source checkout (v0.19.x)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).with_name("lr_schedule_reference.txt")))
    args = ap.parse_args()
    module, Optimizer = load_deepspeed_lr_schedules(args.deepspeed)

    class StubOptimizer(Optimizer):
        def __init__(self, lr):
            self.defaults = {"lr": lr, "betas": (0.9, 0.999)}
            self.param_groups = [{"lr": lr, "betas": (0.9, 0.999)}]

    lines = [
        "# DeepSpeed LR schedule values as the optimizer sees them; generated by",
        "# tests/golden/make_schedule_reference.py from deepspeed/runtime/lr_schedules.py of DeepSpeed v0.19.5.",
    ]
    for n, (kind, opt_lr, params, dense_end) in enumerate(CASES):
        opt = StubOptimizer(opt_lr)
        sched = getattr(module, kind)(opt, **params)
        kv = " ".join(f"{k}={json.dumps(v)}" for k, v in params.items())
        lines.append(f"schedule {n} {kind} {opt_lr!r} {kv}")

        def record(it):
            g = opt.param_groups[0]
            b1, b2 = g["betas"]
            moves_betas = kind == "OneCycle" and params.get("cycle_momentum", True)
            lines.append(f"{it} {g['lr']!r} " + (f"{b1!r} {b2!r}" if moves_betas else "- -"))

        record(-1)
        for it in range(dense_end + 1):
            sched.step()
            record(it)
        for it in FAR:
            sched.step(it)
            record(it)
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
