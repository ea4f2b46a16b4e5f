#!/usr/bin/env bash
# zerotk-ckpt end to end, on the checkpoint zerotk_export_sample saved (3 ranks, stage 2):
#   - export in fp32 and bf16; read_safetensors.py (Python standard library only, independent of
#     zerotk's writer) compares names, shapes, metadata and bytes with the weights the engine
#     gathered (bf16: the script rounds the fp32 reference itself);
#   - verify passes; inspect lists the tags and parameters;
#   - a flipped byte in a rank file: verify and export exit 1 naming the file, no output file appears;
#   - bad command lines exit 2;
#   - hostile `latest` and --tag (issue 49, item 3): a FIFO and a link to /dev/zero are refused at
#     once, escape sequences are printed escaped, --tag takes tag names only.
#
#   tests/checkpoint/export_test.sh ZEROTK_CKPT EXPORT_SAMPLE PYTHON READ_SAFETENSORS_PY WORK_DIR
set -euo pipefail
ckpt_tool=$1 sample=$2 python=$3 reader=$4 dir=$5
fail() { echo "FAIL: $*"; exit 1; }

"$sample" "$dir" > /dev/null
for dtype in fp32 bf16; do
  "$ckpt_tool" export "$dir/ckpt" --out "$dir/model.$dtype.safetensors" --dtype "$dtype" > "$dir/export.$dtype.log" 2>&1 ||
    { cat "$dir/export.$dtype.log"; fail "export --dtype $dtype"; }
  grep -q "wrote .*: 6 tensors of $dtype (tag global_step2)" "$dir/export.$dtype.log" || fail "export summary line ($dtype)"
  "$python" "$reader" "$dir/model.$dtype.safetensors" "$dir/weights.ref.txt" "$dir/weights.ref.bin" ||
    fail "the $dtype export differs from the engine's gathered weights"
done

"$ckpt_tool" verify "$dir/ckpt" | grep -q "^OK .*global_step2: manifest, 3 rank file(s) and the client state verified" ||
  fail "verify of a good checkpoint"
inspect=$("$ckpt_tool" inspect "$dir/ckpt")
grep -q "global_step2   <- latest" <<< "$inspect" || fail "inspect: no latest tag line"
grep -q "world size 3, ZeRO stage 2, precision fp32, optimizer AdamW" <<< "$inspect" || fail "inspect: no summary line"
grep -qE "fc0.weight +\[17, 13\] +fp32, group 0" <<< "$inspect" || fail "inspect: no parameter line"

cp -r "$dir/ckpt" "$dir/bad"
printf '\x01' | dd of="$dir/bad/global_step2/rank1.bin" bs=1 seek=100 conv=notrunc status=none
set +e
"$ckpt_tool" verify "$dir/bad" > "$dir/verify_bad.log" 2>&1; rc=$?
"$ckpt_tool" export "$dir/bad" --out "$dir/bad.safetensors" > "$dir/export_bad.log" 2>&1; rc_export=$?
"$ckpt_tool" export "$dir/ckpt" --out "$dir/x.safetensors" --dtype fp8 > /dev/null 2>&1; rc_usage=$?
"$ckpt_tool" frobnicate "$dir/ckpt" > /dev/null 2>&1; rc_command=$?
set -e
[[ $rc -eq 1 ]] || fail "verify of a corrupt checkpoint exited $rc, expected 1"
grep -q "rank1.bin" "$dir/verify_bad.log" || fail "verify did not name the corrupt file: $(cat "$dir/verify_bad.log")"
[[ $rc_export -eq 1 ]] || fail "export of a corrupt checkpoint exited $rc_export, expected 1"
grep -q "rank1.bin" "$dir/export_bad.log" || fail "export did not name the corrupt file"
[[ ! -e "$dir/bad.safetensors" && ! -e "$dir/bad.safetensors.tmp" ]] || fail "a failed export left a file"
[[ $rc_usage -eq 2 && $rc_command -eq 2 ]] || fail "bad command lines exited $rc_usage and $rc_command, expected 2"
# Hostile latest: each run is bounded by `timeout` so that a regression fails instead of hanging.
for kind in fifo zero escape; do
  cp -r "$dir/ckpt" "$dir/$kind"
  rm "$dir/$kind/latest"
  case $kind in
    fifo) mkfifo "$dir/$kind/latest" ;;
    zero) ln -s /dev/zero "$dir/$kind/latest" ;;
    escape) printf 'global\033[2Jstep2' > "$dir/$kind/latest" ;;
  esac
  set +e
  timeout 20 "$ckpt_tool" verify "$dir/$kind" > "$dir/verify_$kind.log" 2>&1; rc=$?
  set -e
  [[ $rc -eq 1 ]] || fail "verify with latest as $kind exited $rc, expected 1: $(cat "$dir/verify_$kind.log")"
done
grep -q "latest: cannot read the \"latest\" file: not a regular file but a FIFO" "$dir/verify_fifo.log" ||
  fail "FIFO latest: $(cat "$dir/verify_fifo.log")"
grep -q "not a regular file but a character device" "$dir/verify_zero.log" || fail "/dev/zero latest: $(cat "$dir/verify_zero.log")"
! grep -q "empty" "$dir/verify_zero.log" || fail "/dev/zero latest reported as empty"
! grep -q $'\033' "$dir/verify_escape.log" || fail "an escape sequence from latest reached the output raw"
grep -qF 'global\u001b[2Jstep2' "$dir/verify_escape.log" || fail "the escaped tag is not shown: $(cat "$dir/verify_escape.log")"
mkdir -p "$dir/other"
cp -r "$dir/ckpt/global_step2" "$dir/other/global_step1"
for tag in ../other/global_step1 "" . .. a/b; do
  set +e
  "$ckpt_tool" verify "$dir/ckpt" --tag "$tag" > "$dir/verify_tag.log" 2>&1; rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "verify --tag '$tag' exited $rc, expected 2: $(cat "$dir/verify_tag.log")"
  grep -q -- "--tag: invalid checkpoint tag" "$dir/verify_tag.log" || fail "verify --tag '$tag': $(cat "$dir/verify_tag.log")"
done
echo "PASS: zerotk-ckpt export (fp32, bf16) equals the gathered weights; verify, inspect and errors behave; hostile latest and --tag refused"
