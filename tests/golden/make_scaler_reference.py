#!/usr/bin/env python3
"""Generates tests/golden/loss_scaler_reference.txt by running DeepSpeed's own DynamicLossScaler.

The reference is DeepSpeed itself, not a re-implementation: the script loads
deepspeed/runtime/fp16/loss_scaler.py from a DeepSpeed source checkout (no installation, no GPU,
no torch needed: the few names the module imports are stubbed) and drives it with seeded random
overflow patterns over a grid of options. tests/precision/test_loss_scaler.cpp replays the same
patterns through zerotk::LossScaler<Dynamic> and compares.

    python3 tests/golden/make_scaler_reference.py --deepspeed PATH/TO/DeepSpeed [--out FILE]

File format (one case per block; '#' lines are comments):
    case <power> <window> <hysteresis> <consecutive 0|1> <min_scale> <raise 0|1> <seed> <steps> <p_calm> <p_storm>
    k <iter> <scale> <hyst> <last_overflow_iter> <fnv64 hex>     (checkpoint after update number <iter>)
    end <iters done> <scale> <hyst> <last_overflow_iter> <fnv64 hex> <error_iter or -1>
The hash is FNV-1a 64 over, per update: skip byte (1 = overflow), scale as little-endian IEEE
double, hyst as little-endian int32. Scales are printed with repr() (shortest round trip).

The overflow pattern: splitmix64 from <seed>; per step two draws u1, u2 = (x >> 11) * 2^-53;
the pattern is in "storm" mode or "calm" mode (starting calm) and toggles when u1 < 1/64;
the step overflows when u2 < (p_storm if storm else p_calm).
"""

import argparse
import importlib.util
import itertools
import pathlib
import struct
import sys
import types

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) * (1.0 / (1 << 53))


def overflow_pattern(seed, steps, p_calm, p_storm):
    rng = SplitMix64(seed)
    storm = False
    for _ in range(steps):
        if rng.uniform() < 1.0 / 64:
            storm = not storm
        yield rng.uniform() < (p_storm if storm else p_calm)


class Fnv1a64:
    def __init__(self):
        self.h = 0xCBF29CE484222325

    def update(self, data):
        for b in data:
            self.h = ((self.h ^ b) * 0x100000001B3) & MASK64


def load_deepspeed_loss_scaler(root):
    """Imports DeepSpeed's loss_scaler.py with stubs for torch, deepspeed.comm/utils/config_utils."""
    torch = types.ModuleType("torch")
    torch.half = torch.float16 = "float16"
    ds = types.ModuleType("deepspeed")
    ds.__path__ = []
    comm = types.ModuleType("deepspeed.comm")
    comm.get_rank = lambda: 0
    ds.comm = comm
    utils = types.ModuleType("deepspeed.utils")

    class _QuietLogger:
        def info(self, *a, **k):
            pass

        warning = info

    utils.logger = _QuietLogger()
    runtime = types.ModuleType("deepspeed.runtime")
    runtime.__path__ = []
    config_utils = types.ModuleType("deepspeed.runtime.config_utils")
    config_utils.DeepSpeedConfigObject = object
    sys.modules.update({
        "torch": torch,
        "deepspeed": ds,
        "deepspeed.comm": comm,
        "deepspeed.utils": utils,
        "deepspeed.runtime": runtime,
        "deepspeed.runtime.config_utils": config_utils,
    })
    path = pathlib.Path(root) / "deepspeed" / "runtime" / "fp16" / "loss_scaler.py"
    spec = importlib.util.spec_from_file_location("ds_loss_scaler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(module, power, window, hysteresis, consecutive, min_scale, raise_err, seed, steps, p_calm, p_storm,
             stride, out):
    scaler = module.DynamicLossScaler(init_scale=2.0**power, scale_window=window, min_scale=min_scale,
                                      delayed_shift=hysteresis, consecutive_hysteresis=bool(consecutive),
                                      raise_error_at_min_scale=bool(raise_err))
    out.append(f"case {power} {window} {hysteresis} {consecutive} {min_scale!r} {raise_err} {seed} {steps} "
               f"{p_calm!r} {p_storm!r}")
    h = Fnv1a64()
    error_iter = -1
    done = 0
    for i, overflow in enumerate(overflow_pattern(seed, steps, p_calm, p_storm)):
        try:
            scaler.update_scale(overflow)
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
            if "minimum" not in str(e):
                raise
            error_iter = i
            break
        h.update(bytes([1 if overflow else 0]) + struct.pack("<d", scaler.cur_scale) +
                 struct.pack("<i", scaler.cur_hysteresis))
        done = i + 1
        if done % stride == 0 and done != steps:
            out.append(f"k {done} {scaler.cur_scale!r} {scaler.cur_hysteresis} {scaler.last_overflow_iter} "
                       f"{h.h:016x}")
    out.append(f"end {done} {scaler.cur_scale!r} {scaler.cur_hysteresis} {scaler.last_overflow_iter} {h.h:016x} "
               f"{error_iter}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deepspeed", required=True, help="root of a DeepSpeed source checkout (v0.19.x)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).with_name("loss_scaler_reference.txt")))
    args = ap.parse_args()
    module = load_deepspeed_loss_scaler(args.deepspeed)

    steps, stride = 1200, 300
    lines = [
        "# DeepSpeed DynamicLossScaler.update_scale traces; generated by tests/golden/make_scaler_reference.py",
        "# from deepspeed/runtime/fp16/loss_scaler.py of DeepSpeed v0.19.5. Format: see the script.",
    ]
    grid = itertools.product(
        [16, 3],             # initial_scale_power: 3 reaches the minimum within a few overflows
        [1, 3, 8],           # loss_scale_window
        [1, 2, 3],           # hysteresis
        [0, 1],              # consecutive_hysteresis
        [1.0, 3.0],          # min_loss_scale: 3 is reached by clamping, not by halving
        [0, 1],              # raise_error_at_min_scale
    )
    for n, (power, window, hyst, consec, min_scale, raise_err) in enumerate(grid):
        # Storms dense enough to walk the scale down to the minimum, calm stretches long enough
        # for several growth windows.
        p_calm, p_storm = (0.02, 0.6) if n % 2 == 0 else (0.1, 0.9)
        run_case(module, power, window, hyst, consec, min_scale, raise_err, 1000 + n, steps, p_calm, p_storm, stride,
                 lines)
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
