#!/usr/bin/env bash
# zerotk-ckpt export of a checkpoint saved from a torch model (by CTest interop_torch, which also
# dumps the module's named_parameters() beside it): the safetensors file, read back by
# read_safetensors.py (Python standard library only, independent of zerotk's writer), holds every
# tensor under its named_parameters() name, with its shape, bit for bit, and the export metadata.
#
#   tests/interop/export_test.sh ZEROTK_CKPT PYTHON READ_SAFETENSORS_PY DIR
set -euo pipefail
tool=$1 python=$2 reader=$3 dir=$4
fail() { echo "FAIL: $*"; exit 1; }
[[ -f $dir/torch.ref.txt && -d $dir/ckpt ]] || fail "no checkpoint or reference dump in $dir (CTest interop_torch writes them)"
rm -f "$dir/tool.safetensors"
"$tool" export "$dir/ckpt" --out "$dir/tool.safetensors" > "$dir/export.log" 2>&1 || { cat "$dir/export.log"; fail "export"; }
grep -q "wrote .*: 6 tensors of fp32" "$dir/export.log" || { cat "$dir/export.log"; fail "export summary line"; }
"$python" "$reader" "$dir/tool.safetensors" "$dir/torch.ref.txt" "$dir/torch.ref.bin" ||
  fail "the export differs from the torch module's parameters"
echo "PASS: zerotk-ckpt export of a torch model's checkpoint equals its named_parameters() bitwise"
