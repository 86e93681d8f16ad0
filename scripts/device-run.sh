#!/usr/bin/env bash
# Run specwatch on the offline GPU host (after the carry kit is installed; docs/gpu-host.md).
#   bash scripts/device-run.sh COMMIT SUITE [specwatch run options...]
# COMMIT is this checkout's commit (the copy on the GPU host has no .git). Results accumulate in
# /tmp/sw-results (kept while the host stays warm, so --resume works across calls) and every
# results file is copied flat into $OUT (at most 8 files come back: logs only with KEEP_LOGS=1).
set -uo pipefail
commit=${1:?commit}; suite=${2:?suite}; shift 2
source /tmp/specwatch-site/env.sh
export PYTHONPATH=$PWD/src:$PYTHONPATH SPECWATCH_COMMIT=$commit PYTHONUNBUFFERED=1
[ "${KEEP_LOGS:-0}" = 1 ] && export SPECWATCH_LOG_DIR=$OUT/logs
R=/tmp/sw-results
python3 -m specwatch.cli run "$suite" --results "$R" "$@"
rc=$?
for f in "$R"/*/*/*.jsonl; do
  [ -f "$f" ] && cp "$f" "$OUT/$(basename "$(dirname "$f")")__$(basename "$f")"
done
python3 scripts/summarize_results.py "$R"/*/*/*.jsonl
exit $rc
