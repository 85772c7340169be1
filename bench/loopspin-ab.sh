#!/bin/bash
# A/B of single-node Kefir variants against Redis on redis-benchmark GET, interleaved per round.
#   bench/loopspin-ab.sh ROUNDS "NAME:BIN:ENV" ...
# e.g. bench/loopspin-ab.sh 7 "off:/tmp/kefir:KEFIR_LOOP_SPIN=off" "auto:/tmp/kefir:X=1"
# Each round starts every variant as a fresh `kefir server --durability sync` (ENV is passed
# with env(1)), loads it with SETs, and runs GET -c 50 -P 16 (-n 2M) and -P 1 (-n 300k) against it
# and then against one redis-server (appendfsync always) started once; it prints the Kefir÷Redis
# ratio of every round and their median per variant. Ports 16390 (Kefir) and 16391 (Redis).
# Hold the bench lock: flock /tmp/kefir-bench.lock bench/loopspin-ab.sh ...
R=$1; shift
rm -rf ${TMPDIR:-/tmp}/loopspin-ab; mkdir -p ${TMPDIR:-/tmp}/loopspin-ab
redis-server --port 16391 --bind 127.0.0.1 --dir ${TMPDIR:-/tmp}/loopspin-ab --save "" --appendonly yes --appendfsync always --daemonize no --logfile ${TMPDIR:-/tmp}/loopspin-ab/r.log &
RP=$!
sleep 0.5; redis-benchmark -p 16391 -q -t set -n 100000 -c 50 -P 16 >/dev/null
rps() { redis-benchmark -p $1 -q -t get -n $2 -c 50 -P $3 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1; }
declare -A res
for r in $(seq 1 $R); do
 for v in "$@"; do
  IFS=: read name bin envs <<<"$v"
  rm -rf ${TMPDIR:-/tmp}/loopspin-ab/k; env $envs $bin server --client-addr 127.0.0.1:16390 --peer-addr "" --http-addr "" --dir ${TMPDIR:-/tmp}/loopspin-ab/k --durability sync --log-level warn 2>${TMPDIR:-/tmp}/loopspin-ab/k.log &
  KP=$!; sleep 0.4; redis-benchmark -p 16390 -q -t set -n 50000 -c 50 -P 16 >/dev/null
  for P in 16 1; do
    n=2000000; [ $P = 1 ] && n=300000
    k=$(rps 16390 $n $P); d=$(rps 16391 $n $P)
    res[$name.$P]="${res[$name.$P]} $(python3 -c "print(round($k/$d,3))")"
  done
  kill $KP; wait $KP 2>/dev/null
 done
 echo "round $r done $(uptime | sed 's/.*average//')"
done
for v in "$@"; do IFS=: read name bin envs <<<"$v"; for P in 16 1; do
  echo "$name P=$P:${res[$name.$P]} median=$(python3 -c "import statistics;print(statistics.median([float(x) for x in '${res[$name.$P]}'.split()]))")"
done; done
kill $RP
