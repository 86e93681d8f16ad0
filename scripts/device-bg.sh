#!/usr/bin/env bash
# A run longer than one device call (10 min): start it detached, then wait for it call by call.
#   bash scripts/device-bg.sh start COMMIT SUITE [SUITE...] [specwatch run options...] [--then SUITE... options...]
#   bash scripts/device-bg.sh wait [SECONDS] [NAME...]   (default 540; returns early when every run ends)
#   bash scripts/device-bg.sh stop                       (SIGTERM the chain's process group)
# `start` copies this checkout to /tmp/NAME-repo (each call re-copies the working tree over the
# original, under a running sweep's imports) and runs scripts/device-run.sh there in its own session
# (setsid: the device keeps such a process when the call returns, until the machine goes back, i.e.
# ~30 s after the last call ends). `--then` chains runs: each segment is one specwatch run (its own
# summary), started when the one before ends, e.g. the cases that matter most first.
# NAME is BG_NAME (default sw-bg); several named runs can be in flight at once, e.g. one per GPU or
# BG_SCRIPT=scripts/device-versions.sh beside a sweep (give both the same --timing-lock / TIMING_LOCK).
# Results go to /tmp/NAME; `wait` packs each into $OUT/NAME.tgz (sw-bg: $OUT/results.tgz) every time,
# so a machine lost between calls loses no finished case, nor an engine start of an unfinished one
# (SUITE.jsonl.starts): carry the archive to the next host and start with RESUME_FROM=ARCHIVE and
# --resume to go on from it.
set -uo pipefail
name=${BG_NAME:-sw-bg}; B=/tmp/$name
case "${1:-}" in
start)
  shift; commit=${1:?commit}; shift
  [ -e $B.pid ] && kill -0 "$(cat $B.pid)" 2>/dev/null && { echo "device-bg.sh: $name is in flight (pid $(cat $B.pid))" >&2; exit 2; }
  # a fresh run starts from an empty folder (an earlier run's, on a warm host, would be packed
  # again and read by its --resume); only --resume keeps what is there
  case " $* " in *" --resume "*) ;; *) rm -rf $B ;; esac
  rm -rf $B-repo $B.rc $B-out && mkdir -p $B $B-out $B-repo
  # RESUME_FROM=ARCHIVE (an earlier `wait`'s NAME.tgz, carried to a fresh host) with --resume: its
  # results and engine-start journals seed an empty results folder, so the run goes on from there
  if [ -n "${RESUME_FROM:-}" ]; then
    case " $* " in *" --resume "*) ;; *) echo "device-bg.sh: RESUME_FROM needs --resume" >&2; exit 2 ;; esac
    [ -f "$RESUME_FROM" ] || { echo "device-bg.sh: RESUME_FROM: no file $RESUME_FROM" >&2; exit 2; }
    if [ -z "$(find $B -name '*.jsonl' -print -quit)" ]; then
      tar -xzf "$RESUME_FROM" -C $B || { echo "device-bg.sh: RESUME_FROM: cannot unpack $RESUME_FROM" >&2; exit 2; }
    else
      echo "device-bg.sh: $B already holds results; RESUME_FROM left unpacked"
    fi
  fi
  tar --exclude='./.kit*' --exclude='./.git' --exclude='./.venv' -cf - . | tar -xf - -C $B-repo
  # the segments, one per line, each argument quoted for the shell that runs them
  segs=""; seg=""
  for a in "$@"; do
    if [ "$a" = --then ]; then segs+="$seg"$'\n'; seg=""; else seg+=" $(printf '%q' "$a")"; fi
  done
  segs+="$seg"
  printf '%s\n' "$segs" | grep -v '^\s*$' > $B.segments
  # the chain's shell writes its own pid: it leads its session and process group (`stop` kills the
  # group). $! is not it where the caller has job control: setsid then forks and $! exits at once.
  rm -f $B.pid
  # the redirections cover the whole background list: a subshell left holding the caller's
  # stdout would keep a caller that reads it (a pipe) waiting for the chain to end
  ( cd $B-repo && OUT=$B-out SPECWATCH_DEVICE_RESULTS=$B exec setsid nohup bash -c '
    echo $$ > '$B'.pid
    rc=0
    while read -r seg; do eval "bash ${BG_SCRIPT:-scripts/device-run.sh} $0 $seg" || rc=$?; done < '$B'.segments
    echo $rc > '$B'.rc' "$commit" ) > $B.log 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -s $B.pid ] && break; sleep 0.1; done
  echo "device-bg.sh: started $name, pid $(cat $B.pid), $(wc -l < $B.segments) run(s), log $B.log"
  ;;
wait)
  limit=${2:-540}; t0=$SECONDS; names=("${@:3}"); [ ${#names[@]} = 0 ] && names=("$name")
  done_all() { for n in "${names[@]}"; do [ -e /tmp/$n.rc ] || return 1; done; }
  while ! done_all && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
  rc=0
  for n in "${names[@]}"; do
    tgz=$n.tgz; [ "$n" = sw-bg ] && tgz=results.tgz
    tar -czf "$OUT/$tgz" -C /tmp/$n .
    cp /tmp/$n.log "$OUT/$n.log" 2>/dev/null
    if [ -e /tmp/$n.rc ]; then
      echo "== device-bg.sh: $n ended, rc $(cat /tmp/$n.rc)"; tail -n "${SUMMARY_LINES:-60}" /tmp/$n.log
      [ "$(cat /tmp/$n.rc)" = 0 ] || rc=$(cat /tmp/$n.rc)
    else
      echo "== device-bg.sh: $n still running after ${limit} s"; grep -vE "^\s*$" /tmp/$n.log | tail -n 15
    fi
  done
  exit $rc
  ;;
stop)
  # SIGTERM the whole chain (its shell's process group: runners, which record what finished and
  # kill their engines' workers); never kill GPU processes by hand, that records them as crashes
  [ -s $B.pid ] && kill -0 "$(cat $B.pid)" 2>/dev/null || { echo "device-bg.sh: $name is not running"; exit 0; }
  kill -TERM -- -"$(cat $B.pid)"
  for _ in $(seq 60); do kill -0 "$(cat $B.pid)" 2>/dev/null || break; sleep 1; done
  echo "device-bg.sh: stopped $name"; echo 143 > $B.rc
  ;;
*) echo "usage: device-bg.sh start COMMIT SUITE... [--then SUITE...] | wait [SECONDS] [NAME...] | stop" >&2; exit 2 ;;
esac
