#!/usr/bin/env bash
# Fetch the Python sources of SGLang releases into the cache tests/test_releases.py reads:
# each release's wheel is downloaded without dependencies (pip download --no-deps), its sglang/
# files (compiled extensions left out) and METADATA unpacked to CACHE/<version>/ and byte-compiled there (hosts with
# PYTHONDONTWRITEBYTECODE=1 would otherwise recompile every release on every test run).
#
#   scripts/fetch_sglang_sources.sh [VERSION ...]
#
# Without arguments: every release specwatch/rules/releases.py has an adapter for. A release
# already unpacked is skipped. CACHE is $SPECWATCH_SGLANG_SRC, default .cache/sglang-src (ignored
# by git); the wheels are deleted after unpacking unless KEEP_WHEELS=1. PYTHON picks the
# interpreter (default .venv/bin/python, else python3); it must be the one the tests run with,
# for the byte-compiled files to be used. COMPILE=0 skips byte-compiling (the sources alone are
# about half the size; every test run then compiles what it imports).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
cache=${SPECWATCH_SGLANG_SRC:-.cache/sglang-src}
wheels="$cache/.wheels"
if [ "$#" -gt 0 ]; then
  versions=("$@")
else
  read -r -a versions <<< "$(PYTHONPATH=src "$PY" -c 'from specwatch.rules.releases import releases; print(*releases())')"
fi
mkdir -p "$wheels"
for v in "${versions[@]}"; do
  if [ -f "$cache/$v/.complete" ]; then
    continue
  fi
  # the wheels are tagged cp311 manylinux_2_34 (Rust extensions, left out below): ask for that tag so
  # any host Python can fetch them
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_34_x86_64 "sglang==$v" -d "$wheels"
  whl=$(ls "$wheels"/sglang-"$v"-*.whl | head -n 1)
  tmp="$cache/$v.partial"
  rm -rf "$tmp"
  "$PY" - "$whl" "$tmp" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    # everything under sglang/ but the compiled extensions (jit_kernel looks for its own sources)
    keep = [n for n in z.namelist()
            if (n.startswith("sglang/") and not n.endswith(".so")) or n.endswith(".dist-info/METADATA")]
    z.extractall(dest, keep)
PY
  if [ "${COMPILE:-1}" = 1 ]; then
    "$PY" -m compileall -q "$tmp/sglang" > /dev/null || true   # a file that does not compile stays as source
  fi
  rm -rf "${cache:?}/$v"
  mv "$tmp" "$cache/$v"
  touch "$cache/$v/.complete"
  [ "${KEEP_WHEELS:-0}" = 1 ] || rm -f "$whl"
  echo "sglang $v -> $cache/$v"
done
