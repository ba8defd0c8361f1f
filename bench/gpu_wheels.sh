#!/usr/bin/env bash
# Here, before measuring on a lent GPU machine: what bench/gpu_device.sh needs there and the machine lacks, in parts
# that each travel with one `run` call.
#
#   bash bench/gpu_wheels.sh      # in the checkout that the session's `run` calls send (its root)
#
# The machine (Python 3.12 with torch, transformers, CUDA 13's nvidia-* wheels and a CPU onnxruntime; no registry)
# lacks onnxruntime-gpu and the service's HTTP packages (FastAPI, uvicorn, pydantic, ...). This downloads them as
# cp312 wheels with pip, packs them and the test split (the sentences every step measures) into one tar, and splits
# the tar into parts of 64 MiB less what the working tree takes (a call carries the tree and one part):
# .gpu-wheels/01/part, 02/part, ..., the last folder also holding `manifest` (the part count and the tar's sha256).
# .git/info/exclude gets /.gpu-wheels/, so the parts travel only where a call names them in `carry`.
#
# It then prints the calls to make, back to back: one part each, the last one running bench/gpu_device.sh. A machine
# keeps what earlier calls carried only while it stays warm (30 s after each call); bench/gpu_device.sh names any
# part that is missing.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PYTHON=${PYTHON:-python3}
CORPUS=${CORPUS:-$HOME/.cache/attnserve/corpus/en-ja/test.tsv}
LIMIT=$((64 << 20))   # what one call carries: the working tree and the paths named in carry
MARGIN=$((1 << 20))
# Packages the lent machine's image has (its package list), left out of the download.
DEVICE_HAS="numpy onnx onnxruntime protobuf packaging sentencepiece prometheus-client tqdm httpx httpcore h11 anyio
idna certifi sniffio click pyyaml uvloop lxml requests urllib3 charset-normalizer annotated-doc"

[ -f "$CORPUS" ] || { echo "gpu_wheels: no test split at $CORPUS (python -m model.corpus build, or CORPUS=...)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/payload"

platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# onnxruntime-gpu as the gpu image pins it, without the CUDA wheels (the machine has CUDA 13's).
"$PYTHON" deploy/requirements.py --gpu --no-cuda | grep '^onnxruntime-gpu==' > "$work/onnxruntime.txt"
"$PYTHON" -m pip download -q --no-deps "${platform[@]}" -d "$work/payload" -r "$work/onnxruntime.txt"
# The service's other requirements with what they need, less what the machine has.
"$PYTHON" deploy/requirements.py | grep -v -E '^(onnxruntime|onnx|numpy)[^a-z_-]' > "$work/service.txt"
"$PYTHON" -m pip download -q "${platform[@]}" -d "$work/payload" -r "$work/service.txt"
for wheel in "$work"/payload/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1 | tr '_A-Z' '-a-z')
  if [[ " $(echo $DEVICE_HAS) " == *" $name "* ]]; then rm "$wheel"; fi
done
cp "$CORPUS" "$work/payload/test.tsv"
tar -C "$work/payload" -cf "$work/payload.tar" .

# What travels with every call: tracked files and untracked ones git does not ignore (and shared/, if here).
tree=$(git ls-files -z --cached --others --exclude-standard | "$PYTHON" -c '
import os, sys
names = [n for n in sys.stdin.buffer.read().decode().split("\0") if n]
shared = [os.path.join(d, f) for d, _, fs in os.walk("shared") for f in fs] if os.path.isdir("shared") else []
print(sum(os.path.getsize(n) for n in set(names + shared) if os.path.isfile(n)))')
part=$(( (LIMIT - tree - MARGIN) >> 20 ))
[ "$part" -ge 8 ] || { echo "gpu_wheels: the working tree ($((tree >> 20)) MiB) leaves no room for parts" >&2; exit 2; }

rm -rf .gpu-wheels
mkdir -p .gpu-wheels
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF '/.gpu-wheels/' "$exclude" 2>/dev/null || echo '/.gpu-wheels/' >> "$exclude"
split -b "${part}M" -d -a 2 "$work/payload.tar" "$work/part."
count=0
for piece in "$work"/part.*; do
  count=$((count + 1))
  folder=$(printf '.gpu-wheels/%02d' "$count")
  mkdir -p "$folder"
  mv "$piece" "$folder/part"
done
printf 'parts %d\nsha256 %s\n' "$count" "$(sha256sum "$work/payload.tar" | cut -d' ' -f1)" > "$folder/manifest"

echo "gpu_wheels: $(ls "$work"/payload/*.whl | wc -l) wheels and the test split, $(( $(stat -c %s "$work/payload.tar") >> 20 )) MiB," \
     "in $count parts of at most $part MiB (the working tree takes $((tree >> 20)) MiB)."
echo "Make these calls back to back (the machine keeps earlier parts only while warm):"
for i in $(seq 1 "$count"); do
  folder=$(printf '.gpu-wheels/%02d' "$i")
  if [ "$i" -lt "$count" ]; then
    echo "  run(command=\"ls -l $folder\", carry=[\"$folder\"], timeout_s=120)"
  else
    echo "  run(command=\"bash bench/gpu_device.sh\", carry=[\"$folder\"], timeout_s=540)"
  fi
done
