#!/usr/bin/env bash
# Here, before measuring on a lent GPU machine: what bench/gpu_device.sh needs there and the machine lacks, in parts
# that each travel with one `run` call.
#
#   bash bench/gpu_wheels.sh [--whole-tree]   # in the checkout that the session's `run` calls send (its root)
#
# The machine (Python 3.12 with torch, transformers, CUDA 13's nvidia-* wheels and a CPU onnxruntime; no registry)
# lacks onnxruntime-gpu and the service's HTTP packages (FastAPI, uvicorn, pydantic, ...). This downloads them as
# cp312 wheels with pip, packs them, the test split (the sentences every step measures) and the en-ja bundle's
# derived int8 graphs (derived here by the ONNX Runtime that made the manifest's sha256, so that the machine's
# onnxruntime-gpu derives nothing) into one tar, and splits the tar into parts that each travel with one call:
# $PARTS/01/part, 02/part, ..., the last folder also holding `manifest` (the part count and the tar's sha256).
#
# The part calls are made with model/bundles left out of the checkout (`git sparse-checkout`, printed below): a
# part then fills 64 MiB less the rest of the working tree. --whole-tree sizes the parts beside the whole tree
# instead, for a tool that sends model/bundles all the same (more, smaller parts). The measuring call, with the
# bundles back, carries nothing: the parts stay on the machine while it stays warm (30 s after each call), and
# bench/gpu_device.sh names any part that is missing.
#
# It prints the calls to make, back to back. bench/gpu_device.sh --rehearse builds the same parts and checks each
# call's size.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PYTHON=${PYTHON:-python3}
CORPUS=${CORPUS:-$HOME/.cache/attnserve/corpus/en-ja/test.tsv}
PARTS=${PARTS:-.gpu-wheels}   # where the parts go, relative to the root: the calls carry them from there
BUNDLE=model/bundles/en-ja    # the bundle the measuring call serves
LIMIT=$((64 << 20))   # what one call carries: the working tree and the paths named in carry
MARGIN=$((1 << 20))
# Packages the lent machine's image has (its package list, with the versions known), left out of the download where
# that version meets the project's requirement.
DEVICE_HAS="numpy==2.5.2 onnx==1.23.1 onnxruntime==1.30.0 protobuf packaging sentencepiece==0.2.2 prometheus-client
tqdm httpx httpcore h11 anyio idna certifi sniffio click pyyaml uvloop lxml requests urllib3 charset-normalizer
annotated-doc"

# tree_bytes [PREFIX]: what a call sends as its working tree (tracked files and untracked ones git does not ignore,
# shared/ if here), less the files under PREFIX.
tree_bytes() {
  git ls-files -z --cached --others --exclude-standard | "$PYTHON" -c '
import os, sys
names = [n for n in sys.stdin.buffer.read().decode().split("\0") if n]
shared = [os.path.join(d, f) for d, _, fs in os.walk("shared") for f in fs] if os.path.isdir("shared") else []
left = sys.argv[1] if len(sys.argv) > 1 else None
print(sum(os.path.getsize(n) for n in set(names + shared) if os.path.isfile(n) and not (left and n.startswith(left))))
' "$@"
}

whole=0
case ${1:-} in
  --whole-tree) whole=1 ;;
  --tree-bytes) shift; tree_bytes "$@"; exit ;;  # bench/gpu_device.sh --rehearse checks the calls with it
  "") ;;
  *) echo "gpu_wheels: unknown argument $1" >&2; exit 2 ;;
esac
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
# shellcheck disable=SC2086  # one package a word
has=" $("$PYTHON" -c '
import sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

wanted = {canonicalize_name(r.name): r.specifier for r in map(Requirement, open(sys.argv[1]).read().split())}
for entry in sys.argv[2:]:
    name, _, version = entry.partition("==")
    name = canonicalize_name(name)
    if not version or name not in wanted or wanted[name].contains(version, prereleases=True):
        print(name, end=" ")' "$work/service.txt" $DEVICE_HAS) "
for wheel in "$work"/payload/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1 | tr '_A-Z' '-a-z')
  if [[ $has == *" $name "* ]]; then rm "$wheel"; fi
done
cp "$CORPUS" "$work/payload/test.tsv"
# The derived int8 graphs, verified against the manifest here (service/runtime/derive.py: missing ones derived).
PYTHONPATH=$PWD "$PYTHON" -c 'import sys; from service.cli.main import main; sys.exit(main())' derive "$BUNDLE" >&2
mkdir -p "$work/payload/derived"
cp "$BUNDLE"/*.int8.onnx "$work/payload/derived/"
tar -C "$work/payload" -cf "$work/payload.tar" .

# What travels with every call: tracked files and untracked ones git does not ignore (and shared/, if here),
# less model/bundles unless --whole-tree.
tree=$(if [ "$whole" = 1 ]; then tree_bytes; else tree_bytes model/bundles/; fi)
part=$(( (LIMIT - tree - MARGIN) >> 20 ))
[ "$part" -ge 8 ] || { echo "gpu_wheels: the working tree ($((tree >> 20)) MiB) leaves no room for parts" >&2; exit 2; }

rm -rf "$PARTS"
mkdir -p "$PARTS"
exclude=$(git rev-parse --git-path info/exclude)
[[ $PARTS = /* ]] || grep -qxF "/$PARTS/" "$exclude" 2>/dev/null || echo "/$PARTS/" >> "$exclude"
split -b "${part}M" -d -a 2 "$work/payload.tar" "$work/part."
count=0
for piece in "$work"/part.*; do
  count=$((count + 1))
  folder=$(printf '%s/%02d' "$PARTS" "$count")
  mkdir -p "$folder"
  mv "$piece" "$folder/part"
done
printf 'parts %d\nsha256 %s\n' "$count" "$(sha256sum "$work/payload.tar" | cut -d' ' -f1)" > "$folder/manifest"

echo "gpu_wheels: $(ls "$work"/payload/*.whl | wc -l) wheels, the test split and the int8 graphs," \
     "$(( $(stat -c %s "$work/payload.tar") >> 20 )) MiB, in $count parts of at most $part MiB" \
     "(the working tree takes $((tree >> 20)) MiB$([ "$whole" = 1 ] || echo ' without model/bundles'))."
echo "Make these calls back to back (the machine keeps the parts only while warm):"
[ "$whole" = 1 ] || echo "  here: git sparse-checkout set --no-cone '/*' '!/model/bundles/'"
for i in $(seq 1 "$count"); do
  folder=$(printf '%s/%02d' "$PARTS" "$i")
  echo "  run(command=\"ls -l $folder\", carry=[\"$folder\"], timeout_s=120)"
done
[ "$whole" = 1 ] || echo "  here: git sparse-checkout disable"
echo "  run(command=\"bash bench/gpu_device.sh\", timeout_s=540)   # again at once if it fails: the rerun"
