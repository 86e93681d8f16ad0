#!/usr/bin/env bash
# One command line on the offline GPU host with an installed kit, as a device-bg.sh segment
# (BG_SCRIPT=scripts/device-cmd.sh), for what is not a `specwatch run`: writing checkpoints,
# scripts/timing_parity.py, a chain of runs on different kits.
#   bash scripts/device-cmd.sh COMMIT 'COMMAND LINE'
# The line is run by bash in this checkout with the kit's Python set up (SPECWATCH_SITE, as
# device-run.sh), so it may name $SPECWATCH_DEVICE_RESULTS (the folder that comes back) and
# $COMMIT. RUN_TIMEOUT bounds it (seconds).
set -uo pipefail
COMMIT=${1:?commit}; shift
[[ $COMMIT =~ ^[0-9a-f]{40}$ ]] || { echo "device-cmd.sh: COMMIT must be a full 40-hex git hash, got '$COMMIT'" >&2; exit 2; }
[ $# -ge 1 ] || { echo "device-cmd.sh: no command line given" >&2; exit 2; }
source "$(dirname "$0")/kit-env.sh" "${SPECWATCH_SITE:-/tmp/specwatch-site}"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} SPECWATCH_COMMIT=$COMMIT COMMIT PYTHONUNBUFFERED=1
export SPECWATCH_DEVICE_RESULTS=${SPECWATCH_DEVICE_RESULTS:-/tmp/sw-results}
mkdir -p "$SPECWATCH_DEVICE_RESULTS"
echo "== device-cmd.sh: $*"
timeout -s TERM -k 30 "${RUN_TIMEOUT:-86400}" bash -c "$*"
rc=$?
echo "== device-cmd.sh: rc $rc"
exit $rc
