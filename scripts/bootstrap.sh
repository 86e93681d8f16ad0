#!/usr/bin/env bash
# Set up .venv from scratch on a fresh machine (no GPU needed): specwatch, its test tools, and
# SGLang's host-side Python for the CPU tier (torch CPU build; no CUDA wheels).
# Idempotent: a second run only checks. Set SPECWATCH_NO_SGLANG=1 to skip SGLang. PIP_COMPILE=0
# installs without byte-compiling (pip's own --no-compile; .ci/run uses it, with bytecode written
# on first import instead).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
compile=()
[ "${PIP_COMPILE:-1}" = 0 ] && compile=(--no-compile)
pip() { .venv/bin/python -m pip "$@"; }
install() { pip install -q "${compile[@]}" "$@"; }
stamp=.venv/.specwatch-bootstrap
want=$(cat pyproject.toml requirements/*.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
install --upgrade pip
if [ "${SPECWATCH_NO_SGLANG:-0}" != 1 ]; then
  # torch 2.13.0 resolves to the CPU build where one is provided locally; see README.
  install "torch==2.13.0"
  install --no-deps -r requirements/sglang-cpu-nodeps.txt
  install -r requirements/sglang-cpu.txt
fi
install -e '.[test]'
echo "$want" > "$stamp"
