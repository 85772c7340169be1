#!/usr/bin/env bash
# What one replicated write costs each replica, counted (issue 31 items 1-2,
# docs/design/write-path.md "Counted per write"): per write at the leader and at each
# follower, the syscalls that matter (fdatasync, socket and log writes, reads, futex,
# epoll waits), context switches, CPU µs and the log's fsyncs, from `perf stat` attached
# to each `kefir server` process for the length of the load and /status's log_fsyncs.
#
#   bench/writepath/count.sh BIN OUT PORT set1|e [N_OR_SECONDS]
#
# set1: one client's sync SET (redis-benchmark -c 1 -P 1 -d 128, N writes, default 5000);
#       per write = per SET.
# e:    YCSB-E at 16 clients, sync inserts, linearizable scans (20,000 records of 1,000 B,
#       2 s warm-up, SECONDS s, default 10; the counters span only the measured part);
#       per write = per insert (ycsb's INSERT count).
# A 3-replica group started by bench/peers/kefir.sh with BIN: client ports PORT..PORT+2,
# HTTP PORT+5.., peer PORT+10.. (all in PORT..PORT+19). Needs perf (syscall tracepoints).
# Hold the bench lock: flock /tmp/kefir-bench.lock bench/writepath/count.sh ...
set -euo pipefail
bin=$1; out=$2; port=$3; mode=$4; n=${5:-}
here=$(cd "$(dirname "$0")" && pwd); P=$here/../peers
rm -rf "$out"; mkdir -p "$out"
export KEFIR_PEER_OFFSET=10 KEFIR_HTTP_OFFSET=5
eps=$($P/kefir.sh start "$out/g" --replicas 3 --port "$port" --view-change-timeout 1s --no-maintenance --bin "$bin")
trap '$P/kefir.sh stop "$out/g" >/dev/null 2>&1 || true' EXIT
lead=""
for _ in $(seq 100); do
  for i in 1 2 3; do
    [ "$(curl -fsS "http://127.0.0.1:$((port + 5 + i - 1))/status" 2>/dev/null | jq -r '.replication.role // empty')" = leader ] && lead=$i
  done
  [ -n "$lead" ] && break
  sleep 0.1
done
[ -n "$lead" ] || { echo "$0: no leader" >&2; exit 1; }
lp=$((port + lead - 1))
fsyncs() { for i in 1 2 3; do curl -fsS "http://127.0.0.1:$((port + 5 + i - 1))/status" | jq -r '.replication.log_fsyncs'; done; }
cpu() { for i in 1 2 3; do awk '{print $14 + $15}' "/proc/$(cat "$out/g/kefir-$i.pid")/stat"; done; }
ev=syscalls:sys_enter_fdatasync,syscalls:sys_enter_write,syscalls:sys_enter_pwrite64,syscalls:sys_enter_read,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_nanosleep,raw_syscalls:sys_enter,context-switches
perfstart() {
  ppids=()
  for i in 1 2 3; do
    perf stat -x, -e "$ev" -p "$(cat "$out/g/kefir-$i.pid")" -o "$out/perf-$i.csv" &
    ppids+=($!)
  done
  sleep 0.3 # perf attached
  f0=($(fsyncs)); c0=($(cpu))
}
perfstop() {
  f1=($(fsyncs)); c1=($(cpu))
  for p in "${ppids[@]}"; do kill -INT "$p"; done
  wait "${ppids[@]}" 2>/dev/null || true
}
case $mode in
  set1)
    n=${n:-5000}
    redis-benchmark -p "$lp" -c 1 -P 1 -n 500 -t set -q >/dev/null # warm up
    perfstart
    redis-benchmark -p "$lp" -c 1 -P 1 -n "$n" -t set -d 128 -r 100000 --precision 3 >"$out/bench.txt"
    perfstop
    echo "SET p50 $(grep -A2 "latency summary" "$out/bench.txt" | tail -1 | awk '{print $3}') ms, $(awk '/throughput summary/{print $3}' "$out/bench.txt") ops/s"
    writes=$n ;;
  e)
    secs=${n:-10}
    (cd "$here/.." && go build -o "$out/ycsb" ./ycsb)
    common=(-db kefir -durability sync -consistency linearizable -addr "$eps" -workloads e -clients 16 -records 20000 -valuesize 1000 -limits-samples 0)
    "$out/ycsb" "${common[@]}" -load-only -load-clients 64 >"$out/load.txt" 2>&1
    "$out/ycsb" "${common[@]}" -load=false -d 2s >/dev/null 2>&1 # warm-up
    perfstart
    "$out/ycsb" "${common[@]}" -load=false -d "${secs}s" -json "$out/e.json" >"$out/e.txt" 2>&1
    perfstop
    writes=$(jq '[.rows[0].result.per_op[] | select(.op == "INSERT") | .count] | add' "$out/e.json")
    jq -r '.rows[0].result | "E: \(.ops_per_sec|floor) ops/s"' "$out/e.json" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
echo "writes: $writes (leader n$lead); per write:"
python3 - "$out" "$lead" "$writes" "${f0[*]}" "${f1[*]}" "${c0[*]}" "${c1[*]}" "$(getconf CLK_TCK)" <<'PY'
import sys, csv
out, lead, w = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
f0, f1, c0, c1 = ([float(x) for x in a.split()] for a in sys.argv[4:8])
hz = float(sys.argv[8])
names = {"syscalls:sys_enter_fdatasync": "fdatasync", "syscalls:sys_enter_write": "write",
         "syscalls:sys_enter_pwrite64": "pwrite64", "syscalls:sys_enter_read": "read",
         "syscalls:sys_enter_futex": "futex", "syscalls:sys_enter_epoll_pwait": "epoll_pwait",
         "syscalls:sys_enter_nanosleep": "nanosleep", "raw_syscalls:sys_enter": "all syscalls",
         "context-switches": "context switches"}
rows = {}
for i in (1, 2, 3):
    for line in open(f"{out}/perf-{i}.csv"):
        p = line.strip().split(",")
        if len(p) > 2 and p[2] in names and p[0] not in ("<not counted>", "<not supported>"):
            rows.setdefault(names[p[2]], {})[i] = float(p[0]) / w
cols = [lead] + [i for i in (1, 2, 3) if i != lead]
hdr = ["leader"] + [f"follower n{i}" for i in cols[1:]]
print("| per write | " + " | ".join(hdr) + " |")
print("|---|" + "---|" * len(cols))
for k in names.values():
    print(f"| {k} | " + " | ".join(f"{rows.get(k, {}).get(i, 0):.2f}" for i in cols) + " |")
print("| log fsyncs (/status) | " + " | ".join(f"{(f1[i-1]-f0[i-1])/w:.2f}" for i in cols) + " |")
print("| CPU µs (/proc) | " + " | ".join(f"{(c1[i-1]-c0[i-1])/hz*1e6/w:.0f}" for i in cols) + " |")
PY
