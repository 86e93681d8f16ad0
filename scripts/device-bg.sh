#!/usr/bin/env bash
# A run longer than one device call (10 min): start it detached, then wait for it call by call.
#   bash scripts/device-bg.sh start COMMIT SUITE [SUITE...] [specwatch run options...]
#   bash scripts/device-bg.sh wait [SECONDS]      (default 540; returns early when the run ends)
# `start` copies this checkout to /tmp/sw-bg-repo (each call re-copies the working tree over the
# original, under a running sweep's imports) and runs scripts/device-run.sh there in its own session
# (setsid: the device keeps such a process when the call returns, until the machine goes back, i.e.
# ~30 s after the last call ends). Results go to /tmp/sw-bg; `wait` packs them into
# $OUT/results.tgz each time, so a machine lost between calls loses no finished case.
# One run, one summary: its wall time is the whole sweep's, which --stop-after/--resume calls split.
set -uo pipefail
B=/tmp/sw-bg
case "${1:-}" in
start)
  shift
  [ -e $B.pid ] && kill -0 "$(cat $B.pid)" 2>/dev/null && { echo "device-bg.sh: a run is in flight (pid $(cat $B.pid))" >&2; exit 2; }
  # a fresh run starts from an empty folder (an earlier run's, on a warm host, would be packed
  # again and read by its --resume); only --resume keeps what is there
  case " $* " in *" --resume "*) ;; *) rm -rf $B ;; esac
  rm -rf $B-repo $B.rc $B-out && mkdir -p $B $B-out $B-repo
  tar --exclude='./.kit*' --exclude='./.git' --exclude='./.venv' -cf - . | tar -xf - -C $B-repo
  cd $B-repo && OUT=$B-out SPECWATCH_DEVICE_RESULTS=$B setsid nohup bash -c \
    'bash scripts/device-run.sh "$@"; echo $? > '$B'.rc' device-bg "$@" > $B.log 2>&1 < /dev/null &
  echo $! > $B.pid
  echo "device-bg.sh: started pid $(cat $B.pid), log $B.log"
  ;;
wait)
  limit=${2:-540}; t0=$SECONDS
  while [ ! -e $B.rc ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
  tar -czf "$OUT/results.tgz" -C $B .
  cp $B.log "$OUT/run.log" 2>/dev/null
  if [ -e $B.rc ]; then echo "device-bg.sh: run ended, rc $(cat $B.rc)"; tail -n "${SUMMARY_LINES:-60}" $B.log; exit "$(cat $B.rc)"; fi
  echo "device-bg.sh: still running after ${limit} s"; grep -vE "^\s*$" $B.log | tail -n 15; exit 0
  ;;
*) echo "usage: device-bg.sh start COMMIT SUITE... | wait [SECONDS]" >&2; exit 2 ;;
esac
