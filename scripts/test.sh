#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run them.
# This is the README's test command; .ci/run runs exactly this, then the linters.
# Then the engine tests against a real vLLM (scripts/engines/vllm.sh: its own virtualenv, cached
# in ~/.cache/loadlab/vllm-venv; a few minutes the first time); LOADLAB_ENGINE_TESTS=0 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
# Everything goes into the checkout's own virtualenv (.venv), never the machine's Python, so two
# checkouts never re-point each other's `loadlab`. torch==2.13.0 is named so pip takes the CPU
# build; the [server] extra accepts any torch>=2.3.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY="$PWD/.venv/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
"$PY" -m pip install -q --disable-pip-version-check torch==2.13.0 -e ".[all,dev]"
# Headless Chromium for the HTML report test (the test is skipped only where no package exists).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "note: chromium could not be installed; the browser test will be skipped"
fi
set +e
# Two workers, each taking whole test files (a file's module-wide servers stay in one process):
# most tests wait on servers and subprocesses, so two at once fit the two cores.
"$PY" -m pytest -n 2 --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
if [ "${LOADLAB_ENGINE_TESTS:-1}" != 0 ]; then
  set +e
  bash scripts/engines/vllm.sh -q
  engine_rc=$?
  set -e
  [ "$rc" = 0 ] && rc=$engine_rc
else
  echo "engine tests skipped (LOADLAB_ENGINE_TESTS=0)"
fi
exit "$rc"
