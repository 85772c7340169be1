#!/bin/bash
# single node, sync durability, redis-benchmark SET -c 50 -P 1 and -P 16, base vs new alternated
for r in 1 2 3; do for v in base new2; do
  d=/tmp/scan3-set-$v; rm -rf $d
  /tmp/scan3-$v server --dir $d --client-addr 127.0.0.1:41395 --peer-addr "" --http-addr "" --durability sync --log-level warn 2>/dev/null & P=$!
  for i in $(seq 50); do redis-cli -p 41395 ping >/dev/null 2>&1 && break; sleep 0.1; done
  c0=$(awk '{print $14+$15}' /proc/$P/stat)
  a=$(redis-benchmark -p 41395 -q -t set -n 200000 -c 50 -P 1 -d 128 -r 100000 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)
  c1=$(awk '{print $14+$15}' /proc/$P/stat)
  b=$(redis-benchmark -p 41395 -q -t set -n 1000000 -c 50 -P 16 -d 128 -r 100000 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)
  c2=$(awk '{print $14+$15}' /proc/$P/stat)
  echo "round $r $v $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): SET -P1 $a req/s ($(( (c1-c0)*10000000/200000 )) ns CPU/req), -P16 $b req/s ($(( (c2-c1)*10000000/1000000 )) ns CPU/req)"
  kill $P; wait $P 2>/dev/null; rm -rf $d
done; done
