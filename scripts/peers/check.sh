#!/usr/bin/env bash
# The clients users already have (vllm bench serve, GuideLLM, AIPerf), run against loadlab-server.
#
#   bash scripts/peers/check.sh [check.py args, e.g. --concurrency 1,4,8 --requests 32]
#
# 1. GuideLLM and AIPerf each in a virtualenv of its own under ~/.cache/loadlab/ (made once,
#    reused while it holds the pinned version; LOADLAB_PEERS_VENVS moves them). GuideLLM needs
#    torch: the CPU build is asked for by its local version, or pip would fetch the CUDA one.
# 2. vllm bench serve from scripts/engines/vllm.sh's virtualenv when it is there (not built here).
# 3. python3 scripts/peers/check.py: one reference server, each tool at each level, its token
#    totals against the server's /metrics (see that file). Not in CI: several minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
VENVS="${LOADLAB_PEERS_VENVS:-$HOME/.cache/loadlab}"
GUIDELLM_SPEC="guidellm==0.8.1"
AIPERF_SPEC="aiperf==0.13.0"
TORCH_SPEC="torch==2.13.0+cpu"

# venv NAME SPEC [more pip args]: the venv's bin folder, made when it lacks SPEC's version.
venv() {
  local dir="$VENVS/$1-venv" spec="$2"
  shift 2
  if ! "$dir/bin/python" - "$spec" >/dev/null 2>&1 <<'PY'
import importlib.metadata as md, sys
name, version = sys.argv[1].split("==")
assert md.version(name) == version
PY
  then
    echo "peers: building $dir with $spec (a few minutes, once)" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" "$@" >&2
  fi
  echo "$dir/bin"
}

GUIDELLM_BIN="$(venv guidellm "$GUIDELLM_SPEC" "$TORCH_SPEC")"
AIPERF_BIN="$(venv aiperf "$AIPERF_SPEC")"
args=(--guidellm "$GUIDELLM_BIN/guidellm" --aiperf "$AIPERF_BIN/aiperf")
VLLM_PY="${LOADLAB_VLLM_VENV:-$HOME/.cache/loadlab/vllm-venv}/bin/python"
if [ -x "$VLLM_PY" ] && "$VLLM_PY" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  args+=(--vllm-python "$VLLM_PY")
else
  echo "peers: no vLLM virtualenv (bash scripts/engines/vllm.sh makes it): vllm bench skipped" >&2
fi
exec python3 scripts/peers/check.py "${args[@]}" "$@"
