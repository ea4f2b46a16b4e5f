#!/usr/bin/env python3
"""Writes the csv_monitor files DeepSpeed would produce for the short run that
tests/monitor/test_training_log.cpp replays, using Python's csv module and Python number types the
way DeepSpeed's csv monitor does: one file per event name, opened in append mode for each write,
a `step,<name>` header the first time a monitor instance writes a file, rows `samples,value`.

    rm -rf tests/monitor/golden/short_run
    python3 tests/monitor/golden/make_short_run.py tests/monitor/golden/short_run

The run: world size 1, micro batch 2, 2 accumulation steps (4 samples per step), fp16 with a
dynamic loss scale starting at the int 2**16, an overflow at step 3 (hysteresis 1: the scale
halves and the step is skipped), wall_clock_breakdown on. Durations are multiples of 1/1024 s so
the milliseconds are exact. Steps 1-5 are one run; steps 6-7 a restarted run (a new monitor).
The comm_wire_bytes, comm_dense_bytes and compression_ratio files are zerotk's own, written in
DeepSpeed's format; the other eight are what DeepSpeed writes.
"""
import csv
import os
import struct
import sys

TICK = 1.0 / 1024  # seconds
FWD, BWD_INNER, BWD_REDUCE = 3 * TICK, 4 * TICK, 1 * TICK
STEP_MICRO, STEP_BOUNDARY = 1 * TICK, 2 * TICK
TRAIN_BATCH = 4
WIRE_BYTES_PER_STEP, DENSE_BYTES = 100, 1000  # step s sends 100 * s bytes in place of 1000


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


LOSSES = [f32(x) for x in (2.3025851249694824, 2.1972246170043945, 2.0794415473937988, 1.9459101152420044,
                           1.7917594909667969, 1.6094379425048828, 1.3862943649291992)]


class CsvFiles:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.started = set()
        os.makedirs(log_dir, exist_ok=True)

    def write(self, name, value, step):
        stem = name.replace("/", "_").replace(" ", "_")
        with open(os.path.join(self.log_dir, stem + ".csv"), "a+") as f:
            w = csv.writer(f)
            if stem not in self.started:
                self.started.add(stem)
                w.writerow(["step", name.split("/")[-1]])
            w.writerow([step, value])


def run(files, first_step, last_step, scale, changed):
    for step in range(first_step, last_step + 1):
        samples_before = (step - 1) * TRAIN_BATCH
        files.write("Train/Samples/train_loss", LOSSES[step - 1], samples_before)
        if step == 3:  # overflow: hysteresis 1 halves the scale (float from here on)
            scale = scale / 2.0
        scheduler_steps = step - 1 if step >= 3 else step  # the skipped step does not advance the scheduler
        lr = 1e-4 * min(scheduler_steps, 4) / 4
        samples = step * TRAIN_BATCH
        files.write("Train/Samples/lr", lr, samples)
        files.write("Train/Samples/loss_scale", scale, samples)
        # zerotk's own rows (DeepSpeed's csv monitor has none): bytes this rank sent since the previous
        # boundary, what it would have sent uncompressed, and their ratio (a float).
        wire, dense = WIRE_BYTES_PER_STEP * step, DENSE_BYTES
        files.write("Train/Samples/comm_wire_bytes", wire, samples)
        files.write("Train/Samples/comm_dense_bytes", dense, samples)
        files.write("Train/Samples/compression_ratio", dense / wire, samples)
        # Boundary timers: the sums of the step's two micro-steps, in milliseconds.
        timers = {
            "forward": [FWD, FWD],
            "backward": [BWD_INNER + BWD_REDUCE, BWD_INNER + BWD_REDUCE],
            "backward_inner": [BWD_INNER, BWD_INNER],
            "backward_allreduce": [BWD_REDUCE, BWD_REDUCE],
            "step": [STEP_MICRO, STEP_BOUNDARY],
        }
        for name, seconds in timers.items():
            files.write("Train/Samples/elapsed_time_ms_" + name, sum(s * 1000.0 for s in seconds), samples)
    return scale


def main():
    out = sys.argv[1]
    scale = run(CsvFiles(out), 1, 5, 2 ** 16, False)
    run(CsvFiles(out), 6, 7, scale, True)  # restarted job appends, with a second header per file


if __name__ == "__main__":
    main()
