#!/bin/bash
# Where a GET's CPU goes, client and server: for each variant (two rounds), a fresh server on
# port 16390 and redis-benchmark GET -c 50 -P 16 (-n 2M) and -P 1 (-n 300k) under perf stat:
# the client's CPU µs per request, the server's, and the server's context switches per 1,000.
#   bench/loopspin-cpu.sh "redis:x:x" "off:/tmp/kefir:KEFIR_LOOP_SPIN=off" "auto:/tmp/kefir:X=1"
# (NAME redis starts redis-server --appendfsync always; else BIN server --durability sync with
# ENV passed through env(1)). Needs perf (linux-perf). Hold /tmp/kefir-bench.lock.
rm -rf ${TMPDIR:-/tmp}/loopspin-cpu; mkdir -p ${TMPDIR:-/tmp}/loopspin-cpu
for r in 1 2; do
for v in "$@"; do
  IFS=: read name bin envs <<<"$v"
  if [ $name = redis ]; then
    redis-server --port 16390 --bind 127.0.0.1 --dir ${TMPDIR:-/tmp}/loopspin-cpu --save "" --appendonly yes --appendfsync always --daemonize no --logfile ${TMPDIR:-/tmp}/loopspin-cpu/r.log & KP=$!
  else
    rm -rf ${TMPDIR:-/tmp}/loopspin-cpu/k; env $envs $bin server --client-addr 127.0.0.1:16390 --peer-addr "" --http-addr "" --dir ${TMPDIR:-/tmp}/loopspin-cpu/k --durability sync --log-level warn 2>${TMPDIR:-/tmp}/loopspin-cpu/k.log & KP=$!
  fi
  sleep 0.5; redis-benchmark -p 16390 -q -t set -n 50000 -c 50 -P 16 >/dev/null
  for P in 16 1; do n=2000000; [ $P = 1 ] && n=300000
  perf stat -x, -e context-switches,task-clock -p $KP -o ${TMPDIR:-/tmp}/loopspin-cpu/srv.txt &
  SP=$!
  out=$(perf stat -x, -e task-clock,context-switches -o ${TMPDIR:-/tmp}/loopspin-cpu/cli.txt redis-benchmark -p 16390 -q -t get -n $n -c 50 -P $P | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)
  kill -INT $SP; wait $SP 2>/dev/null
  ct=$(awk -F, '$3=="task-clock"{print $1}' ${TMPDIR:-/tmp}/loopspin-cpu/cli.txt); st=$(awk -F, '$3=="task-clock"{print $1}' ${TMPDIR:-/tmp}/loopspin-cpu/srv.txt); scs=$(awk -F, '$3=="context-switches"{print $1}' ${TMPDIR:-/tmp}/loopspin-cpu/srv.txt)
  echo "$name P=$P rps=$out cli_us/req=$(python3 -c "print(round($ct*1000/$n,3))") srv_us/req=$(python3 -c "print(round($st*1000/$n,3))") srv_cs/1k=$(python3 -c "print(round($scs*1000/$n,2))")"
  done
  kill $KP; wait $KP 2>/dev/null
done; done
