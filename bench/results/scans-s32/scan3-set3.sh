#!/bin/bash
# 3 replicas, sync SET -c 50 -P 1 against the leader (replica 1 at bootstrap), base vs new2 alternated
P=/work/wt/scan3/bench/peers; export KEFIR_PEER_OFFSET=10 KEFIR_HTTP_OFFSET=5
for r in 1 2 3; do for v in base new3; do
  d=/tmp/scan3-set3-$v; rm -rf $d
  for try in 1 2 3; do e=$($P/kefir.sh start $d --port 41300 --no-maintenance --bin /tmp/scan3-$v --replicas 3 --view-change-timeout 1s 2>/dev/null) && break; sleep 2; done
  for i in $(seq 100); do [ "$(redis-cli -p 41300 set warm 1 2>/dev/null)" = OK ] && break; sleep 0.1; done
  pids=$(cat $d/kefir-*.pid); c0=0; for p in $pids; do c0=$((c0 + $(awk '{print $14+$15}' /proc/$p/stat))); done
  a=$(redis-benchmark -p 41300 -q -t set -n 100000 -c 50 -P 1 -d 128 -r 100000 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)
  c1=0; for p in $pids; do c1=$((c1 + $(awk '{print $14+$15}' /proc/$p/stat))); done
  echo "round $r $v $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): 3 replicas SET -c 50 -P 1 $a req/s ($(( (c1-c0)*10000000/100000 )) ns server CPU/req)"
  $P/kefir.sh stop $d >/dev/null 2>&1
done; done
