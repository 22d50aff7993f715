#!/usr/bin/env bash
# The GPU items in one run, on a machine with one NVIDIA GPU, its driver, torch with CUDA and
# nvidia-ml-py (pip install -e '.[server,gpu]'):
#
#   bash scripts/gpu_checks.sh [OUT_DIR]          # about 5 minutes on an H200
#
# 1. the 1b preset's GPU test (tests/server_model/test_model.py -m gpu);
# 2. the model runner's decode and prefill steps on the 1b preset (benchmarks/batching.py):
#    tokens/s and the HBM bandwidth each decode step reads, batch 1 to 64;
# 3. the reference server's 1b preset under loadlab at batch 1 and 64, with NVML telemetry and
#    energy per token (benchmarks/gpu_telemetry.py).
# Each step has its own time limit and a failed step does not stop the next; the logs go to
# OUT_DIR (default reports/gpu-checks). Exits non-zero when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-reports/gpu-checks}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
rc=0
step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"
  shift 2
  echo "=== $name (limit ${limit} s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
  local s=${PIPESTATUS[0]}
  echo "=== $name: exit $s after $((SECONDS - t0)) s"
  [ "$s" = 0 ] || rc=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.max.mem \
  --format=csv 2>&1 | tee "$out/gpu.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0))' 2>&1 | tee -a "$out/gpu.txt"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/gpu.txt"
step gpu-test 100 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/server_model/test_model.py
step batching 150 "$PY" benchmarks/batching.py --preset 1b --context 256 \
  --batches 1,8,32,64 --prompts 128,512,2048 --prefill-batch 8 --repeats 3
step gpu-telemetry 270 "$PY" benchmarks/gpu_telemetry.py --out-dir "$out/telemetry"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/gpu.txt"
exit "$rc"
