#!/usr/bin/env bash
# The dress rehearsal of a lent GPU machine's calls, on the CPU: fails where the first call there would.
#
#   bash bench/gpu_device.sh --rehearse [COMMIT]   # COMMIT: HEAD by default; in this checkout's root, needs PyPI
#
# In a temporary folder, it builds what the GPU machine would hold and runs the measuring call's steps on it:
#   - the machine's Python: a fresh Python 3.12 venv with, of the machine's packages, those the steps import, at its
#     versions where known (numpy 2.5.2, onnx 1.23.1, onnxruntime 1.30.0, sentencepiece 0.2.2; the others as PyPI
#     serves them);
#   - the tree it receives: COMMIT's tracked files (git archive: no derived graphs, no built extensions), with this
#     checkout's bench/gpu_device.sh (the measuring call's steps);
#   - bench/gpu_wheels.sh's parts, built from this checkout, each call's size checked against the 64 MiB a call
#     carries, then unpacked and installed by bench/gpu_device.sh's install step; onnxruntime-gpu cannot run without a
#     GPU, so the CPU build of its version (onnxruntime 1.31.1) replaces it once installed;
#   - torch: this machine has a CPU build for Python 3.11 alone, so bench/gpu.py (the one step that imports torch)
#     runs in a second fresh venv, Python 3.11 with torch 2.13.0, transformers 5.17.0, the machine's other packages
#     and the payload's at the payload's versions (that onnxruntime 1.31.1 again); every other step runs on 3.12;
#   - every step at --smoke size, the CPU standing in for CUDA; then at most 8 files under $OUT, as a call returns.
#
# PYTHON: this checkout's Python with the project's packages (bench/gpu_wheels.sh derives the int8 graphs with it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

commit=${1:-HEAD}
PYTHON=${PYTHON:-python3}
LIMIT=$((64 << 20))  # what one call carries
RETURNED=8  # files a call brings back from $OUT
# The lent machine's packages that the steps import (/work/.library/device/KINDS.md's list), less onnxruntime; numpy
# 2.5 is for Python 3.12 and newer alone, so the 3.11 venv takes the newest numpy for 3.11.
MACHINE=(onnx==1.23.1 sentencepiece==0.2.2 protobuf packaging prometheus-client tqdm httpx click pyyaml uvloop lxml
         requests annotated-doc sacrebleu)
TEXTS=("Open file" "Save the file" "Delete the selected files?" "Settings" "Close the window" "Print the page"
       "The file could not be opened." "Check for updates")

say() { echo "rehearse: $*"; }
fail() { echo "rehearse: FAILED: $*" >&2; exit 1; }

# interpreter VERSION: a python of that version, on the PATH or installed by pyenv.
interpreter() {
  local found
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  for found in "$(command -v "python$1" || true)" "$root"/versions/"$1".*/bin/"python$1"; do
    if [ -x "$found" ] && "$found" -V > /dev/null 2>&1; then echo "$found"; return 0; fi
  done
  fail "no Python $1 here (pyenv install $1)"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearse.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
pip_quiet=(-q --disable-pip-version-check)

say "the machine's Python 3.12 and packages: numpy==2.5.2 ${MACHINE[*]} onnxruntime==1.30.0"
"$(interpreter 3.12)" -m venv "$work/py312"
"$work/py312/bin/pip" install "${pip_quiet[@]}" numpy==2.5.2 "${MACHINE[@]}" onnxruntime==1.30.0 2>&1 | grep -v 'is ignored' || true
"$work/py312/bin/python" -c 'import onnxruntime, numpy' || fail "the Python 3.12 venv did not install"

say "the payload: bench/gpu_wheels.sh"
printf '%s\treference\n' "${TEXTS[@]}" > "$work/texts.tsv"
PARTS="$work/parts" CORPUS="$work/texts.tsv" PYTHON="$PYTHON" bash bench/gpu_wheels.sh | tee "$work/wheels.log"

say "the calls' sizes (at most $((LIMIT >> 20)) MiB each)"
without=$(PYTHON="$PYTHON" bash bench/gpu_wheels.sh --tree-bytes model/bundles/)
whole=$(PYTHON="$PYTHON" bash bench/gpu_wheels.sh --tree-bytes)
for folder in "$work"/parts/*/; do
  size=$(( without + $(du -sb "$folder" | cut -f1) ))
  say "  part call $(basename "$folder"): $((size >> 20)) MiB (the tree without model/bundles and the part)"
  [ "$size" -le "$LIMIT" ] || fail "part $(basename "$folder") and the tree come to $size bytes"
done
say "  measuring call: $((whole >> 20)) MiB (the whole tree, nothing carried)"
[ "$whole" -le "$LIMIT" ] || fail "the working tree alone is $whole bytes"

say "the tree as the machine receives it: git archive $commit, this checkout's bench/gpu_device.sh, the parts"
mkdir -p "$work/tree/.gpu-wheels"
git archive "$commit" | tar -x -C "$work/tree"
cp bench/gpu_device.sh "$work/tree/bench/gpu_device.sh"
cp -r "$work"/parts/* "$work/tree/.gpu-wheels/"

cat "$work"/parts/*/part | tar -t | sed -n 's|^\./||; s|\.whl$||p' > "$work/wheels.txt"
ort=$(sed -n 's/^onnxruntime_gpu-\([^-]*\)-.*/\1/p' "$work/wheels.txt")
[ -n "$ort" ] || fail "no onnxruntime-gpu wheel in the payload"
say "onnxruntime-gpu $ort's stand-in: onnxruntime $ort, the CPU build"
"$work/py312/bin/pip" download "${pip_quiet[@]}" --no-deps --only-binary=:all: -d "$work/stand-in" \
  "onnxruntime==$ort" 2>&1 | grep -v 'is ignored' || true
stand_in=$(ls "$work"/stand-in/onnxruntime-*.whl) || fail "no onnxruntime $ort wheel for Python 3.12"

pins=$(awk -F- '$1 != "onnxruntime_gpu" {print $1 "==" $2}' "$work/wheels.txt")
say "bench/gpu.py's Python 3.11 with torch 2.13.0, transformers 5.17.0, onnxruntime $ort and the payload's" $pins
"$(interpreter 3.11)" -m venv "$work/py311"
# shellcheck disable=SC2086  # one requirement a word
"$work/py311/bin/pip" install "${pip_quiet[@]}" numpy $(printf '%s\n' "${MACHINE[@]}" | grep -v -i -F -f <(
  printf '%s\n' $pins | sed 's/==.*/==/')) torch==2.13.0 transformers==5.17.0 "onnxruntime==$ort" $pins 2>&1 | grep -v 'is ignored' || true
"$work/py311/bin/python" -c 'import torch, transformers, onnxruntime' || fail "the Python 3.11 venv did not install"

say "the measuring call's steps, --smoke size"
status=0
(cd "$work/tree" && OUT="$work/out" PYTHON="$work/py312/bin/python" TORCH_PYTHON="$work/py311/bin/python" \
  SITE="$work/site" PAYLOAD="$work/payload" ORT_STAND_IN="$stand_in" PYTHONPATH="" \
  bash bench/gpu_device.sh --smoke --install --texts "$work/texts.tsv") || status=$?
returned=$(find "$work/out" -type f | wc -l)
say "files under \$OUT: $returned ($(cd "$work/out" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' '))"
if [ "$status" -ne 0 ]; then
  grep -E '^==== .*: exit [1-9]|Error' "$work/out/run.log" >&2
  fail "the measuring call failed after $(( $(date +%s) - started )) s (above: its run.log's errors)"
fi
[ "$returned" -le "$RETURNED" ] || fail "$returned files under \$OUT: a call brings back $RETURNED"
say "passed in $(( $(date +%s) - started )) s"
