#!/usr/bin/env bash
# YCSB-E (scans) A/B: two Kefir binaries and redis-server side by side, interleaved per round
# (docs/design/scans.md, "Figures").
#   bench/scans-ab.sh OUT REPLICAS ROUNDS OLD_BIN NEW_BIN [BASE_PORT]
# e.g. bench/scans-ab.sh /tmp/scans-one 1 5 /tmp/kefir-old /tmp/kefir-new 27500
# Starts the three systems at once (Kefir with --no-maintenance; REPLICAS 3: a group with a 1 s
# view-change timeout; Redis without persistence), loads each with 100,000 records of 1,000 B,
# then runs E at 16 clients (2 s warm-up, 10 s) on each in turn, the order rotated every round,
# and prints the medians: ops/s, scan p50, server CPU µs/op (every server process, /proc) and
# client CPU µs/op (the ycsb process). Ports BASE (old), BASE+20 (new), BASE+REDIS_OFFSET (Redis,
# default 200), with their peer (+KEFIR_PEER_OFFSET, default 100) and HTTP (+KEFIR_HTTP_OFFSET,
# default 50) ports: KEFIR_PEER_OFFSET=10 KEFIR_HTTP_OFFSET=5 REDIS_OFFSET=40 fits a run in 50
# ports. Builds bench/ycsb once into OUT; OLD_YCSB=PATH drives the old binary with another
# harness (e.g. the base's, for its client: then the old row is the base end to end).
set -uo pipefail
out=$1; reps=$2; rounds=$3; oldbin=$4; newbin=$5; port=${6:-27500}
here=$(cd "$(dirname "$0")" && pwd); P=$here/peers
rm -rf "$out"; mkdir -p "$out"
(cd "$here" && go build -o "$out/ycsb" ./ycsb) || exit 1
Y=$out/ycsb; YOLD=${OLD_YCSB:-$Y}
extra=(); [ "$reps" -gt 1 ] && extra=(--replicas 3 --view-change-timeout 1s)
eold=$($P/kefir.sh start $out/old --port $port --no-maintenance --bin "$oldbin" "${extra[@]}")
enew=$($P/kefir.sh start $out/new --port $((port + 20)) --no-maintenance --bin "$newbin" "${extra[@]}")
eredis=$($P/redis.sh start $out/redis --port $((port + ${REDIS_OFFSET:-200})) --fsync off --no-maintenance)
cat $out/old/kefir-*.pid >$out/pids-old; cat $out/new/kefir-*.pid >$out/pids-new; cat $out/redis/redis-*.pid >$out/pids-redis
common=(-workloads e -clients 16 -records 100000 -valuesize 1000 -limits-samples 0)
kflags=(-db kefir -durability sync -consistency linearizable)
$YOLD "${kflags[@]}" -addr $eold "${common[@]}" -load-only -load-clients 64 >$out/load-old.txt 2>&1
$Y "${kflags[@]}" -addr $enew "${common[@]}" -load-only -load-clients 64 >$out/load-new.txt 2>&1
$Y -db redis -durable no -addr $eredis "${common[@]}" -load-only -load-clients 64 >$out/load-redis.txt 2>&1
order=(old new redis)
for r in $(seq $rounds); do
  for s in "${order[@]}"; do
    y=$Y
    case $s in
      old) a=("${kflags[@]}" -addr $eold); y=$YOLD ;;
      new) a=("${kflags[@]}" -addr $enew) ;;
      redis) a=(-db redis -durable no -addr $eredis) ;;
    esac
    echo "round $r $s $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $out/log
    $y "${a[@]}" "${common[@]}" -load=false -warmup 2s -d 10s -server-pids $out/pids-$s -json $out/r$r-$s.json >$out/r$r-$s.txt 2>&1
  done
  order=("${order[@]:1}" "${order[0]}")
done
$P/kefir.sh stop $out/old; $P/kefir.sh stop $out/new; $P/redis.sh stop $out/redis
python3 - "$out" <<'PY'
import json, sys, glob, statistics as st
d = sys.argv[1]
print("| system | ops/s (rounds) | median | scan p50 µs | server CPU µs/op | client CPU µs/op |")
print("|---|---|---|---|---|---|")
for s in ("old", "new", "redis"):
    rs = []
    for f in sorted(glob.glob(f"{d}/r*-{s}.json"), key=lambda f: int(f.rsplit("/r", 1)[1].split("-")[0])):
        r = json.load(open(f))["rows"][0]
        scan = [p for p in r["result"]["per_op"] if p["op"] == "SCAN"][0]
        rs.append((r["result"]["ops_per_sec"], scan["p50_us"], r["cost"]["server_cpu_us_per_op"], r["result"]["process_cpu_us_per_op"]))
    if rs:
        m = [st.median(x[i] for x in rs) for i in range(4)]
        print(f"| {s} | {' / '.join(f'{x[0]:,.0f}' for x in rs)} | {m[0]:,.0f} | {m[1]:,.0f} | {m[2]:.1f} | {m[3]:.1f} |")
PY
