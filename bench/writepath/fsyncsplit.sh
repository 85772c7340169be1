#!/usr/bin/env bash
# Where a replica's log fdatasync spends its time, from the block layer (issue 31 item 1,
# docs/design/write-path.md, "The log's fdatasync in place"): perf records the block
# requests and the fdatasync syscalls system-wide while
#
#   bench/writepath/fsyncsplit.sh run [run.sh options]   runs bench/writepath/run.sh: the
#       replicas' fdatasyncs (one client's SETs) against the zero-filled probe's, same run
#   bench/writepath/fsyncsplit.sh gap [DIR]              runs cadbench/fsyncloop (one file,
#       300-byte steps) with 0, 1 ms and 5 ms between a sync and the next write
#
# and fsyncsplit.py prints, per fdatasync, the data write's issue and device time, the
# rest (the wait for the device flush, the flush, the wake-up), and how many also wrote
# the inode's block. FSYNCSPLIT_SCHED=1 records the scheduler's wake-ups and switches too
# (a larger recording: ~0.8 GB for a run) and prints how long the callers and the kworkers
# that issue the flushes waited for a core inside the fdatasyncs. Needs perf with tracepoint access (root). Hold the bench lock:
#   flock /tmp/kefir-bench.lock bench/writepath/fsyncsplit.sh run --port 45500
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mode=${1:-}; shift || true
events=(-e block:block_rq_issue -e block:block_rq_complete -e syscalls:sys_enter_fdatasync -e syscalls:sys_exit_fdatasync)
[ "${FSYNCSPLIT_SCHED:-0}" = 0 ] || events+=(-e sched:sched_wakeup -e sched:sched_switch)
script() { perf script -i "$1" -F comm,pid,tid,cpu,time,event,trace 2>/dev/null; }
case "$mode" in
run)
  dir=$(mktemp -d /tmp/fsyncsplit.XXXXXX)
  perf record -q -a -o "$dir/perf.data" "${events[@]}" -- sleep 600 >/dev/null 2>&1 &
  perf_pid=$!
  sleep 1
  "$here/run.sh" --dir "$dir/run" "$@" >"$dir/run.out" 2>&1 &
  run_pid=$!
  pids=""
  while kill -0 "$run_pid" 2>/dev/null; do
    p=$(pgrep -d, -f "$dir/run/kefir server" || true)
    [ -z "$p" ] || pids=$p
    sleep 0.5
  done
  wait "$run_pid" || { cat "$dir/run.out"; exit 1; }
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  sed -n '1,/latency summary/p;/latency summary/,+3p' "$dir/run.out" | awk '!seen[$0]++'
  script "$dir/perf.data" >"$dir/perf.txt"
  python3 "$here/fsyncsplit.py" "$dir/perf.txt" "replicas=$pids" probe=comm:fsyncloop
  rm -rf "$dir"
  ;;
gap)
  dir=${1:-$(mktemp -d /tmp/fsyncsplit.XXXXXX)}
  mkdir -p "$dir"
  (cd "$root/bench" && go build -o "$dir/fsyncloop" ./cadbench/fsyncloop)
  for gap in 0 1ms 5ms; do
    mkdir -p "$dir/f"
    perf record -q -a -o "$dir/perf.data" "${events[@]}" -- \
      "$dir/fsyncloop" -mode overwrite -n 1 -size 300 -gap "$gap" -d 2s -dir "$dir/f" >/dev/null 2>&1
    script "$dir/perf.data" >"$dir/perf.txt"
    python3 "$here/fsyncsplit.py" "$dir/perf.txt" "gap_$gap=comm:fsyncloop"
    rm -rf "$dir/f" "$dir/perf.data" "$dir/perf.txt"
  done
  ;;
*) sed -n '2,15p' "$0"; exit 2 ;;
esac
