#!/usr/bin/env bash
# The GPU measurements in one `run` call on a lent GPU machine (about 4 minutes), everything written under $OUT:
#
#   run.log            every step's output, then its exit status and seconds
#   sanity.json        bench/gpu_sanity.py: the provider the service gets, the CUDA libraries loaded, gpu_mem_limit
#                      as a session sees it, the device's memory as /metrics reads it
#   gpu.json           bench/gpu.py: tokens on CUDA = the CPU's (greedy and beam 4, the exact graphs and the device
#                      decoder), then batch 32 and 128, greedy and beam 4, float32 and float16, both runners
#                      against transformers on the same GPU (median of 3); each runner's step split by where its
#                      time goes, batch 1 to 128; last, the device decoder with and without CUDA graphs
#   BENCHMARKS.md      the sections of bench/gpu.py and bench/graph_profile.py; gpu-throughput.png, gpu.py's plot
#   profile.json       bench/graph_profile.py --provider cuda: nodes (kernels) per decoding step, those on the CPU
#   http.json          bench/gpu_http.py: the service over HTTP on the GPU (batch-1 latency, sentences/s with 32
#                      clients, attnserve_gpu_memory_bytes)
#
# There (python3 with torch, transformers and CUDA 13's nvidia-* wheels, a CPU onnxruntime, no registry), after
# bench/gpu_wheels.sh's parts were carried, one a call, back to back, the next call runs this:
#   bash bench/gpu_device.sh
# It unpacks the parts into $SITE (/tmp/site: onnxruntime-gpu first on the path, the machine's nvidia-* wheels beside
# it, where onnxruntime.preload_dlls() looks), puts the carried int8 graphs into the bundle and builds the two C
# extensions for the machine's Python. Its step limits add up to less than the call's 540 s, and bench/gpu.py writes
# gpu.json after each stage, so a call stopped at its limit still brings back what it finished.
#
# Here, on the CPU:
#   OUT=/tmp/out bash bench/gpu_device.sh --smoke [--bundle DIR] [--texts TSV]   # the steps, tiny sizes, nothing
#                                                         # installed (tests/bench/test_gpu_device.py)
#   bash bench/gpu_device.sh --rehearse [COMMIT]          # bench/gpu_rehearse.sh: the calls as the GPU machine
#                                                         # gets them, on the CPU (docs/BENCHMARKS.md)
set -uo pipefail
cd "$(dirname "$0")/.."

smoke=0 install=0 rehearse="" bundle=model/bundles/en-ja texts=""
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) smoke=1 ;;
    --install) install=1 ;;  # with --smoke: the install step first (--rehearse's call)
    --rehearse) rehearse=HEAD; [[ ${2:-} != -* && -n ${2:-} ]] && { rehearse=$2; shift; } ;;
    --bundle) bundle=$2; shift ;;
    --texts) texts=$2; shift ;;
    *) echo "gpu_device: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}  # bench/gpu.py's: the Python with torch (another one in --rehearse)
[ -z "$rehearse" ] || exec bash bench/gpu_rehearse.sh "$rehearse"
: "${OUT:?gpu_device: set OUT, the folder the results go to}"
mkdir -p "$OUT"
LOG=$OUT/run.log
failed=()

# step NAME SECONDS COMMAND...: run it with a time limit, its output and then its status and time into run.log.
step() {
  local name=$1 limit=$2 started status
  shift 2
  started=$(date +%s)
  echo "==== $name: $*" >> "$LOG"
  timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >> "$LOG" 2>&1  # bash: a step may be a function
  status=$?
  echo "==== $name: exit $status after $(( $(date +%s) - started )) s" >> "$LOG"
  echo "$name: exit $status after $(( $(date +%s) - started )) s"
  [ "$status" -eq 0 ] || failed+=("$name")
  return "$status"
}

# The carried parts, checked against the manifest, unpacked and installed into $SITE (once: a rerun finds them).
install() {
  local manifest parts sha missing=()
  manifest=$(ls .gpu-wheels/*/manifest 2>/dev/null | tail -1)
  [ -n "$manifest" ] || { echo "no .gpu-wheels/*/manifest: carry bench/gpu_wheels.sh's last part"; return 1; }
  parts=$(awk '$1 == "parts" {print $2}' "$manifest")
  sha=$(awk '$1 == "sha256" {print $2}' "$manifest")
  for i in $(seq 1 "$parts"); do
    [ -f "$(printf '.gpu-wheels/%02d/part' "$i")" ] || missing+=("$(printf '%02d' "$i")")
  done
  [ ${#missing[@]} -eq 0 ] || { echo "missing parts: ${missing[*]} (the machine went back between calls: carry them again)"; return 1; }
  if [ "$(cat "$SITE/.payload" 2>/dev/null)" = "$sha" ]; then
    echo "installed before"
    return 0
  fi
  rm -rf "$PAYLOAD" && mkdir -p "$PAYLOAD"
  cat .gpu-wheels/*/part > "$PAYLOAD.tar"
  echo "$sha  $PAYLOAD.tar" | sha256sum --check --quiet || return 1
  tar -C "$PAYLOAD" -xf "$PAYLOAD.tar" && rm "$PAYLOAD.tar"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$PAYLOAD"/*.whl || return 1
  cp "$PAYLOAD"/derived/*.int8.onnx "$BUNDLE"/  # derived by the manifest's onnxruntime: nothing derived here
  if [ -n "${ORT_STAND_IN:-}" ]; then  # --rehearse: the CPU build of onnxruntime-gpu's version in its place
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$ORT_STAND_IN" || return 1
  else
    # The machine's CUDA 13 and cuDNN wheels where preload_dlls() looks for them: beside onnxruntime.
    ln -sfn "$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])')" "$SITE/nvidia"
  fi
  PYTHONPATH=$SITE "$PYTHON" -c 'import onnxruntime as o; print(o.__file__, o.__version__, o.get_available_providers())' &&
    echo "$sha" > "$SITE/.payload"
}

# attnserve's C extensions for each Python the steps run, as pyproject.toml builds them, where they are missing.
extensions() {
  local python include suffix
  for python in $(printf '%s\n' "$PYTHON" "$TORCH_PYTHON" | sort -u); do
    if "$python" -c 'import service.runtime._beam, service.runtime._attention' 2>/dev/null; then
      echo "$python: present"
      continue
    fi
    include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    cc -O3 -Wno-psabi -shared -fPIC -I"$include" service/runtime/_beam.c -o "service/runtime/_beam$suffix" &&
      cc -O3 -Wno-psabi -shared -fPIC -I"$include" -Ithird_party/onnxruntime/include service/runtime/_attention.c \
        -lm -o "service/runtime/_attention$suffix" &&
      "$python" -c 'import service.runtime._beam, service.runtime._attention' || return 1
  done
}

PAYLOAD=${PAYLOAD:-/tmp/gpu-payload} BUNDLE=$bundle
export -f install extensions
export PYTHON TORCH_PYTHON SITE PAYLOAD BUNDLE

if [ "$smoke" = 1 ]; then
  provider=cpu
  sizes=(--sentences 8 --check-sentences 4 --batch-sizes 1 4 --max-length 12 --breakdown-batches 1 4 --repeats 1)
  profile_sizes=(--sentences 8 --batch 4)
  http_sizes=(--latency-requests 10 --clients 4 --seconds 3)
  limits=(install=300 extensions=120 sanity=300 gpu=900 http=300 profile=300)  # the CPU, shared
else
  provider=cuda install=1
  # docs/BENCHMARKS.md "Measuring on a lent GPU machine": about 4 minutes, the limits 530 s together
  sizes=(--sentences 256 --check-sentences 128 --batch-sizes 32 128 --breakdown-batches 1 32 128 --repeats 3)
  profile_sizes=(--sentences 128 --batch 32)
  http_sizes=(--latency-requests 100 --clients 32 --seconds 10)
  limits=(install=60 extensions=30 sanity=40 gpu=250 http=60 profile=30)
fi
declare -A limit
for pair in "${limits[@]}"; do limit[${pair%=*}]=${pair#*=}; done
if [ "$install" = 1 ]; then
  step install "${limit[install]}" install || { echo "gpu_device: nothing installed: see $LOG"; exit 1; }
  [ -n "$texts" ] || texts=$PAYLOAD/test.tsv
fi
[ "$install" = 0 ] || PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
torch_path=$PYTHONPATH  # bench/gpu.py's: $SITE holds the payload for $PYTHON's version alone
[ "$TORCH_PYTHON" = "$PYTHON" ] || torch_path=$PWD
texts_flag=()
[ -z "$texts" ] || texts_flag=(--texts "$texts")

work=$(mktemp -d)  # bench/gpu.py's conversions: the bundle's copy with float16 graphs, the MarianMTModel
trap 'rm -rf "$work"' EXIT

# The short steps first; bench/gpu.py, the longest, writes gpu.json after each of its stages; the profile of the
# float16 copy that it makes last.
step extensions "${limit[extensions]}" extensions || { echo "gpu_device: no C extensions: see $LOG"; exit 1; }
step sanity "${limit[sanity]}" "$PYTHON" bench/gpu_sanity.py --bundle "$bundle" --provider "$provider" \
  --out "$OUT/sanity.json"
step http "${limit[http]}" "$PYTHON" bench/gpu_http.py --bundle "$bundle" "${texts_flag[@]}" "${http_sizes[@]}" \
  --provider "$provider" --results "$OUT/http.json"
step profile-float32 "${limit[profile]}" "$PYTHON" bench/graph_profile.py --bundle "$bundle" "${texts_flag[@]}" \
  "${profile_sizes[@]}" --provider "$provider" --variant float32 --out "$OUT" --json "$OUT/profile.json"
step gpu "${limit[gpu]}" env PYTHONPATH="$torch_path" "$TORCH_PYTHON" bench/gpu.py --bundle "$bundle" \
  "${texts_flag[@]}" "${sizes[@]}" --beams 1 4 --engines attnserve transformers --provider "$provider" \
  --work "$work" --out "$OUT" --results "$OUT/gpu.json" --runners old new --breakdown --cuda-graph
step profile-float16 "${limit[profile]}" "$PYTHON" bench/graph_profile.py --bundle "$work/bundle" \
  "${texts_flag[@]}" "${profile_sizes[@]}" --provider "$provider" --variant float16 --out "$OUT"

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_device: failed: ${failed[*]} (see $LOG)"
  exit 1
fi
echo "gpu_device: every step passed; results in $OUT"
