#!/usr/bin/env bash
# Several installed SGLang versions run at once on one GPU host; timed batches stay one at a time
# across all of them (one --timing-lock shared by every run, which --overlap-starts requires).
#   VERSIONS="0.5.12 0.5.13" bash scripts/device-versions.sh COMMIT SUITE... --parallel-starts K [options]
# Version V must be installed at /tmp/sw-site-<V without dots> (0.5.12: /tmp/sw-site-0512; see
# docs/gpu-host.md, "Another SGLang version"). Each run writes /tmp/sw-vers/<V>; all come back in
# $OUT/results.tgz. Each run's summary says timing_lock_shared: its wall time holds the others'
# timed batches, so its cost ratio is not its own. RUN_TIMEOUT bounds each run.
# SPECWATCH_DEVICE_RESULTS replaces /tmp/sw-vers (kept, not emptied: device-bg.sh empties it) and
# TIMING_LOCK the lock, e.g. one lock shared with another sweep on the same host.
set -uo pipefail
commit=${1:?commit}; shift
: "${VERSIONS:?VERSIONS=\"0.5.12 ...\"}"
R=${SPECWATCH_DEVICE_RESULTS:-/tmp/sw-vers}; [ "$R" = /tmp/sw-vers ] && rm -rf $R
lock=${TIMING_LOCK:-$R.lock}; rm -rf $R-out && mkdir -p $R $R-out
pids=()
for v in $VERSIONS; do
  site=/tmp/sw-site-${v//./}
  [ -f "$site/env.sh" ] || { echo "device-versions.sh: SGLang $v is not installed at $site" >&2; exit 3; }
  mkdir -p $R-out/$v
  SPECWATCH_SITE=$site SPECWATCH_DEVICE_RESULTS=$R/$v OUT=$R-out/$v SUMMARY_LINES=0 \
    bash "$(dirname "$0")/device-run.sh" "$commit" "$@" --overlap-starts --timing-lock $lock \
    > $R-out/$v.log 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
tar -czf "$OUT/results.tgz" -C $R .
for v in $VERSIONS; do echo "== SGLang $v"; grep -E "^(ok|skipped|failed|crashed|timeout) " $R-out/$v.log | cut -c1-200; done
exit $rc
