#!/usr/bin/env bash
# Run specwatch on the offline GPU host (after the carry kit is installed; docs/gpu-host.md).
#   bash scripts/device-run.sh COMMIT SUITE [SUITE...] [specwatch run options...]
# COMMIT is this checkout's commit (the copy on the GPU host has no .git). Results accumulate in
# /tmp/sw-results (kept while the host stays warm, so --resume works across calls) and come back
# packed in $OUT/results.tgz (at most 8 files come back; engine logs, packed in $OUT/logs.tgz, only with KEEP_LOGS=1).
# RUN_TIMEOUT bounds the run (seconds); SUMMARY_LINES bounds the summary printed at the end.
# SPECWATCH_SITE selects an installed kit (default /tmp/specwatch-site), e.g. another SGLang version.
set -uo pipefail
commit=${1:?commit}; shift
# provenance names the checkout by its full hash (a short one was passed once: records say 6f6aba3ac)
[[ $commit =~ ^[0-9a-f]{40}$ ]] || { echo "device-run.sh: COMMIT must be a full 40-hex git hash, got '$commit'" >&2; exit 2; }
site=${SPECWATCH_SITE:-/tmp/specwatch-site}
source "$(dirname "$0")/kit-env.sh" "$site"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} SPECWATCH_COMMIT=$commit PYTHONUNBUFFERED=1
[ "${KEEP_LOGS:-0}" = 1 ] && export SPECWATCH_LOG_DIR=/tmp/sw-logs && mkdir -p /tmp/sw-logs
R=${SPECWATCH_DEVICE_RESULTS:-/tmp/sw-results}
# RUN_TIMEOUT (s): SIGTERM the runner, which kills its engines; finished cases stay recorded.
# --foreground keeps the runner in this script's process group (timeout otherwise moves it into one
# of its own), so a SIGTERM of the group (`device-bg.sh stop`) reaches the runner and it records its stop.
# Line-buffered: a detached run's log, read by `device-bg.sh wait`, shows each case as it ends
# (grep | cut buffered it in blocks: the log stayed empty until a run's summary; mawk does too).
# the checkout's committed results hold the A/A runs behind the floors: the run's "noisy host:" line
# reads them there, not in the empty results folder it writes to
floors=(); [ -d results ] && case " $* " in *" --floors "*) ;; *) floors=(--floors "$PWD/results") ;; esac
timeout --foreground -s TERM -k 30 "${RUN_TIMEOUT:-86400}" python3 -m specwatch.cli run "$@" --results "$R" "${floors[@]}" 2>&1 \
  | grep --line-buffered -vE "^\s*$|━|Progress" | $(command -v stdbuf >/dev/null && echo stdbuf -oL) cut -c1-400
rc=${PIPESTATUS[0]}
if [ "${KEEP_LOGS:-0}" = 1 ]; then  # what the GPUs and processes looked like when the run ended
  { date; nvidia-smi; ps -eo pid,ppid,etime,pcpu,rss,args --sort=-pcpu | head -40; } >> /tmp/sw-logs/host-state.txt 2>&1
fi
tar -czf "$OUT/results.tgz" -C "$R" .
[ "${KEEP_LOGS:-0}" = 1 ] && tar -czf "$OUT/logs.tgz" -C /tmp/sw-logs .
[ "${SUMMARY_LINES:-400}" != 0 ] && python3 scripts/summarize_results.py "$R"/*/*/*.jsonl | tail -n "${SUMMARY_LINES:-400}"
exit $rc
