#!/usr/bin/env python3
"""Generates tests/golden/sparsity_layouts.txt by running DeepSpeed's own sparsity configs.

The script loads deepspeed/ops/sparse_attention/sparsity_config.py from a DeepSpeed source checkout
(no installation, no torch: a small stand-in gives the three-dimensional integer tensor the file
uses: zeros, item and slice assignment, tril), seeds Python's `random` before each layout exactly
as a user would, and records every head's key blocks per query block.
tests/context/test_sparsity.cpp compares zerotk::context::make_layout against it.

    python3 tests/golden/make_sparsity_layouts.py --deepspeed PATH/TO/DeepSpeed [--out FILE]

File format ('#' lines are comments):
    layout <id> <Class> seq_len=<N> seed=<s> <key>=<value> ...   (the class's arguments; values as JSON)
    <head> <query block>: <key blocks, ascending>                 (one line per head and query block)
"""

import argparse
import importlib.util
import json
import pathlib
import random
import sys
import types


class Tensor3:
    """The part of a torch int64 tensor of three dimensions that sparsity_config.py uses."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        h, r, c = self.shape
        self.v = [[[0] * c for _ in range(r)] for _ in range(h)]

    @staticmethod
    def _range(index, size):
        if isinstance(index, slice):
            return range(*index.indices(size))
        if isinstance(index, (list, tuple)):
            return list(index)
        return [index]

    def __setitem__(self, key, value):
        hs, rs, cs = (self._range(k, n) for k, n in zip(key, self.shape))
        for a in hs:
            for b in rs:
                for c in cs:
                    self.v[a][b][c] = value.v[b][c] if isinstance(value, Plane) else value

    def __getitem__(self, key):
        h, rows, cols = key
        assert isinstance(h, int) and rows == slice(None) and cols == slice(None)
        return Plane(self.v[h])


class Plane:
    def __init__(self, v):
        self.v = [list(row) for row in v]


def tril(t):
    out = Tensor3(t.shape)
    for a in range(t.shape[0]):
        for b in range(t.shape[1]):
            for c in range(t.shape[2]):
                out.v[a][b][c] = t.v[a][b][c] if c <= b else 0
    return out


def load_sparsity_config(root):
    torch = types.ModuleType("torch")
    torch.int64 = "int64"
    torch.zeros = lambda shape, dtype=None: Tensor3(shape)
    torch.tril = tril
    sys.modules["torch"] = torch
    path = pathlib.Path(root) / "deepspeed/ops/sparse_attention/sparsity_config.py"
    spec = importlib.util.spec_from_file_location("ds_sparsity_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (class, seq_len, seed, arguments): every mode, both directions, short last windows, several heads
# with their own layouts, global ranges, random blocks under several seeds.
CASES = [
    ("DenseSparsityConfig", 64, 0, {"num_heads": 2, "block": 16}),
    ("FixedSparsityConfig", 160, 0, {"num_heads": 2, "block": 16}),
    ("FixedSparsityConfig", 160, 0, {"num_heads": 2, "block": 16, "attention": "unidirectional"}),
    ("FixedSparsityConfig", 176, 0, {"num_heads": 4, "block": 16, "different_layout_per_head": True, "num_local_blocks": 4,
                                     "num_global_blocks": 1, "num_different_global_patterns": 4,
                                     "horizontal_global_attention": True}),
    ("FixedSparsityConfig", 208, 0, {"num_heads": 3, "block": 16, "different_layout_per_head": True, "num_local_blocks": 6,
                                     "num_global_blocks": 2, "num_different_global_patterns": 3,
                                     "attention": "unidirectional"}),
    ("VariableSparsityConfig", 192, 1, {"num_heads": 2, "block": 16, "num_random_blocks": 2, "local_window_blocks": [2, 3],
                                        "global_block_indices": [0, 5]}),
    ("VariableSparsityConfig", 192, 7, {"num_heads": 3, "block": 16, "different_layout_per_head": True, "num_random_blocks": 1,
                                        "local_window_blocks": [3], "global_block_indices": [1, 6],
                                        "global_block_end_indices": [3, 8], "attention": "unidirectional"}),
    ("VariableSparsityConfig", 128, 3, {"num_heads": 2, "block": 16, "local_window_blocks": [4], "global_block_indices": [2],
                                        "horizontal_global_attention": True}),
    # 64 blocks: seven draws take random.sample's pool, three its set of picks.
    ("VariableSparsityConfig", 1024, 11, {"num_heads": 1, "block": 16, "num_random_blocks": 7, "local_window_blocks": [8],
                                          "global_block_indices": [0]}),
    ("VariableSparsityConfig", 1024, 12, {"num_heads": 1, "block": 16, "num_random_blocks": 3, "local_window_blocks": [8],
                                          "global_block_indices": [0]}),
    ("BigBirdSparsityConfig", 160, 2, {"num_heads": 2, "block": 16}),
    ("BigBirdSparsityConfig", 160, 5, {"num_heads": 3, "block": 16, "different_layout_per_head": True, "num_random_blocks": 2,
                                       "num_sliding_window_blocks": 5, "num_global_blocks": 2}),
    ("BigBirdSparsityConfig", 160, 9, {"num_heads": 2, "block": 16, "num_random_blocks": 1, "attention": "unidirectional"}),
    ("BSLongformerSparsityConfig", 160, 0, {"num_heads": 2, "block": 16}),
    ("BSLongformerSparsityConfig", 160, 0, {"num_heads": 2, "block": 16, "num_sliding_window_blocks": 5,
                                            "global_block_indices": [0, 4], "global_block_end_indices": [2, 6],
                                            "attention": "unidirectional"}),
    ("LocalSlidingWindowSparsityConfig", 128, 0, {"num_heads": 2, "block": 16, "num_sliding_window_blocks": 5}),
    ("LocalSlidingWindowSparsityConfig", 128, 0, {"num_heads": 2, "block": 16, "num_sliding_window_blocks": 3,
                                                  "attention": "bidirectional"}),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed", required=True, help="a DeepSpeed source checkout")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).with_name("sparsity_layouts.txt")))
    args = parser.parse_args()
    module = load_sparsity_config(args.deepspeed)
    lines = ["# DeepSpeed's sparsity layouts (tests/golden/make_sparsity_layouts.py; Python %d.%d's random)."
             % sys.version_info[:2]]
    for i, (cls, seq_len, seed, kwargs) in enumerate(CASES):
        random.seed(seed)
        layout = getattr(module, cls)(**kwargs).make_layout(seq_len)
        arg_text = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in kwargs.items())
        lines.append(f"layout {i} {cls} seq_len={seq_len} seed={seed} {arg_text}")
        heads, blocks, _ = layout.shape
        for h in range(heads):
            for q in range(blocks):
                keys = [k for k in range(blocks) if layout.v[h][q][k]]
                lines.append(f"{h} {q}: " + " ".join(map(str, keys)))
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
