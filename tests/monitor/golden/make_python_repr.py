#!/usr/bin/env python3
"""Writes python_repr.txt: IEEE-754 doubles (as 16 hex digits of their bits) and Python's repr()
of each, the reference for zerotk::monitor::python_repr. Seeded, so reruns give the same file.

    python3 tests/monitor/golden/make_python_repr.py > tests/monitor/golden/python_repr.txt
"""
import math
import random
import struct


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def main():
    rng = random.Random(20240611)
    values = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 1e-4, 1e-5, 9.999999999999999e-05, 1e15, 1e16, 9999999999999998.0,
              1e16 * 1.5, 65536.0, 32768.0, 2.0 ** 53, 2.0 ** 63, 5e-324, 2.2250738585072014e-308,
              1.7976931348623157e308, 123456789.125, 0.30000000000000004, 2.5e-05, 7.5e-05, 1e22, 1e-7]
    values += [2.0 ** e for e in range(-40, 70, 3)]
    values += [struct.unpack("<f", struct.pack("<f", math.log(k)))[0] for k in range(2, 40)]  # float32 losses
    for _ in range(1500):  # arbitrary finite bit patterns
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            values.append(x)
    for _ in range(1500):  # decimal-looking values around the fixed/scientific switch points
        values.append(rng.randint(1, 99999) * 10.0 ** rng.randint(-12, 20) * rng.choice([1, -1]))
    for v in values:
        print(f"{bits(v):016x} {v!r}")


if __name__ == "__main__":
    main()
