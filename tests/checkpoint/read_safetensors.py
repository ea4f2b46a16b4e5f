#!/usr/bin/env python3
"""Reads a safetensors file with the Python standard library only (struct, json), independently of
zerotk's writer, checks its structure, and lists it or compares it with a reference dump.

    read_safetensors.py FILE                       list metadata and tensors
    read_safetensors.py FILE REF.txt REF.bin       compare; exit 1 on any difference
        [--ignore-metadata]                        compare tensors only

Exit status: 0 when FILE is well formed (and equals the reference), 1 otherwise; every problem is
printed on its own line ("FILE: ..."), then a summary line.

Structure checks on FILE: an 8-byte little-endian header length N; N bytes of UTF-8 JSON (an object;
spaces may pad it); the data starting at a multiple of 8 (zerotk's writer promises this, the format
recommends it); every tensor with a known dtype, a shape of non-negative integers and data_offsets
[begin, end] with end - begin = numel * itemsize; the tensors' ranges back to back from 0 (in offset
order) covering the whole data area: no gap, no overlap, no trailing bytes; "__metadata__", if there,
an object of strings.

Reference dump (what a test, or an engine's gathered weights, say the file must hold):

    REF.txt  UTF-8 text, one record per line, fields separated by single spaces; blank lines and
             lines starting with '#' are ignored:
                 metadata x<key> x<value>
                 tensor x<name> <dtype> [<dim> ...]      (no dims: a scalar)
             x<...> is 'x' followed by the hex digits of the text's UTF-8 bytes ("x" alone: empty),
             so names with spaces, quotes or newlines need no escaping rules. dtype: a safetensors
             dtype (F32, F16, BF16, F64, I32, U8, ...).
    REF.bin  the tensors' bytes, little-endian, concatenated in the order of the tensor lines, each
             exactly numel * itemsize bytes.

Comparison: FILE must hold exactly the reference's tensors (any order) with the same shapes and,
unless --ignore-metadata, exactly its metadata. Bytes are compared exactly, with one conversion: a
reference F32 tensor may stand for a BF16 or F16 tensor of FILE; the script rounds it to nearest even
itself (overflow becomes inf; NaN stays NaN, quieted, keeping sign and top payload bits as zerotk's
conversion does) and then compares bits, so an export in 16 bits can be checked against fp32 master
weights.
"""

import json
import math
import struct
import sys

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class Problems:
    def __init__(self, path):
        self.path = path
        self.lines = []

    def add(self, message):
        self.lines.append(f"{self.path}: {message}")


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def read_safetensors(path, problems):
    """Returns (metadata dict, {name: (dtype, shape, bytes)}), or None if the file cannot be parsed."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        problems.add(f"shorter than the 8-byte header length ({len(blob)} bytes)")
        return None
    (n,) = struct.unpack_from("<Q", blob, 0)
    if 8 + n > len(blob):
        problems.add(f"header length {n} runs past the end of the file ({len(blob)} bytes)")
        return None
    if (8 + n) % 8 != 0:
        problems.add(f"data area starts at byte {8 + n}, not a multiple of 8")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.add(f"header is not UTF-8 JSON: {e}")
        return None
    if not isinstance(header, dict):
        problems.add("header is not a JSON object")
        return None
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        problems.add("__metadata__ is not an object of strings")
        metadata = {}
    tensors = {}
    ranges = []
    for name, t in header.items():
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            problems.add(f"tensor {name!r}: expected exactly dtype, shape, data_offsets; got {t!r}")
            continue
        dtype, shape, offsets = t["dtype"], t["shape"], t["data_offsets"]
        if dtype not in ITEMSIZE:
            problems.add(f"tensor {name!r}: unknown dtype {dtype!r}")
            continue
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            problems.add(f"tensor {name!r}: bad shape {shape!r}")
            continue
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            problems.add(f"tensor {name!r}: bad data_offsets {offsets!r}")
            continue
        begin, end = offsets
        if end - begin != numel(shape) * ITEMSIZE[dtype]:
            problems.add(f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                         f"shape {shape} of {dtype} needs {numel(shape) * ITEMSIZE[dtype]}")
        if end > len(data):
            problems.add(f"tensor {name!r}: data_offsets end {end} lies past the data area ({len(data)} bytes)")
        ranges.append((begin, end, name))
        tensors[name] = (dtype, shape, data[begin:end])
    at = 0
    for begin, end, name in sorted(ranges):
        if begin != at:
            problems.add(f"tensor {name!r}: data starts at {begin}, the previous tensor ends at {at} (gap or overlap)")
        at = max(at, end)
    if at != len(data):
        problems.add(f"tensors cover {at} bytes of a data area of {len(data)} bytes")
    return metadata, tensors


def unhex(field, problems, line_no):
    if not field.startswith("x"):
        problems.add(f"line {line_no}: expected x<hex>, got {field!r}")
        return None
    try:
        return bytes.fromhex(field[1:]).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        problems.add(f"line {line_no}: bad x<hex> field {field!r}: {e}")
        return None


def read_reference(txt_path, bin_path, problems):
    """Returns (metadata dict, [(name, dtype, shape, bytes)]), or None."""
    with open(bin_path, "rb") as f:
        blob = f.read()
    metadata, tensors, at = {}, [], 0
    with open(txt_path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            fields = line.split(" ")
            if fields[0] == "metadata" and len(fields) == 3:
                k, v = unhex(fields[1], problems, line_no), unhex(fields[2], problems, line_no)
                if k is not None and v is not None:
                    metadata[k] = v
            elif fields[0] == "tensor" and len(fields) >= 3:
                name, dtype = unhex(fields[1], problems, line_no), fields[2]
                if name is None:
                    continue
                if dtype not in ITEMSIZE:
                    problems.add(f"line {line_no}: unknown dtype {dtype!r}")
                    return None
                try:
                    shape = [int(d) for d in fields[3:]]
                except ValueError:
                    problems.add(f"line {line_no}: bad shape {fields[3:]!r}")
                    return None
                size = numel(shape) * ITEMSIZE[dtype]
                if at + size > len(blob):
                    problems.add(f"line {line_no}: tensor {name!r} needs bytes [{at}, {at + size}) of a {len(blob)}-byte file")
                    return None
                tensors.append((name, dtype, shape, blob[at:at + size]))
                at += size
            else:
                problems.add(f"line {line_no}: expected 'metadata x<key> x<value>' or 'tensor x<name> <dtype> <dims>'")
                return None
    if at != len(blob):
        problems.add(f"{len(blob) - at} bytes after the last tensor's")
    return metadata, tensors


def f32_to_bf16_bits(bits):
    if (bits & 0x7fffffff) > 0x7f800000:
        return (bits >> 16) | 0x0040  # NaN: quiet, keep sign and top payload
    return ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) & 0xffff


def f32_to_f16_bits(bits):
    (x,) = struct.unpack("<f", struct.pack("<I", bits))
    if math.isnan(x):
        return ((bits >> 16) & 0x8000) | 0x7e00 | ((bits >> 13) & 0x3ff)
    try:
        (h,) = struct.unpack("<H", struct.pack("<e", x))  # CPython rounds half to even
    except OverflowError:
        h = 0xfc00 if x < 0 else 0x7c00
    return h


def round_f32(raw, dtype):
    """fp32 little-endian bytes -> BF16/F16 little-endian bytes, round to nearest even."""
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    convert = f32_to_bf16_bits if dtype == "BF16" else f32_to_f16_bits
    return struct.pack(f"<{len(words)}H", *(convert(w) for w in words))


def compare(file_meta, file_tensors, ref_meta, ref_tensors, problems, ignore_metadata):
    if not ignore_metadata and file_meta != ref_meta:
        for k in sorted(set(file_meta) | set(ref_meta)):
            if file_meta.get(k) != ref_meta.get(k):
                problems.add(f"metadata {k!r}: file has {file_meta.get(k)!r}, reference {ref_meta.get(k)!r}")
    ref_names = [t[0] for t in ref_tensors]
    for name in sorted(set(file_tensors) - set(ref_names)):
        problems.add(f"tensor {name!r} is in the file but not in the reference")
    for name, ref_dtype, ref_shape, ref_bytes in ref_tensors:
        if name not in file_tensors:
            problems.add(f"tensor {name!r} is missing from the file")
            continue
        dtype, shape, data = file_tensors[name]
        if shape != ref_shape:
            problems.add(f"tensor {name!r}: shape {shape}, reference {ref_shape}")
            continue
        expected = ref_bytes
        if dtype != ref_dtype:
            if ref_dtype == "F32" and dtype in ("BF16", "F16"):
                expected = round_f32(ref_bytes, dtype)
            else:
                problems.add(f"tensor {name!r}: dtype {dtype}, reference {ref_dtype}")
                continue
        if data != expected:
            item = ITEMSIZE[dtype]
            first = next(i for i in range(len(data)) if data[i] != expected[i]) // item
            problems.add(f"tensor {name!r}: bytes differ at element {first}: file "
                         f"{data[first * item:(first + 1) * item].hex()}, expected {expected[first * item:(first + 1) * item].hex()}")


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    flags = [a for a in argv[1:] if a.startswith("--")]
    if len(args) not in (1, 3) or any(f != "--ignore-metadata" for f in flags):
        print(__doc__, file=sys.stderr)
        return 2
    problems = Problems(args[0])
    parsed = read_safetensors(args[0], problems)
    if parsed is not None and len(args) == 1:
        metadata, tensors = parsed
        for k, v in sorted(metadata.items()):
            print(f"metadata {k!r} = {v!r}")
        for name, (dtype, shape, data) in tensors.items():
            print(f"tensor {name!r} {dtype} {shape} {len(data)} bytes")
    elif parsed is not None:
        ref_problems = Problems(args[1])
        ref = read_reference(args[1], args[2], ref_problems)
        problems.lines += ref_problems.lines
        if ref is not None:
            compare(*parsed, *ref, problems, "--ignore-metadata" in flags)
    for line in problems.lines:
        print(line)
    if problems.lines:
        print(f"FAILED: {len(problems.lines)} problem(s)")
        return 1
    print("OK" if len(args) == 1 else f"OK: {args[0]} matches the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
