#!/bin/bash
# A/W rows of make compare's 3-replica sync row, base vs new alternated (ports 41300.. / 41320..)
out=/tmp/scan3-aw3; rm -rf $out; mkdir -p $out
P=/work/wt/scan3/bench/peers; export KEFIR_PEER_OFFSET=10 KEFIR_HTTP_OFFSET=5
eold=$($P/kefir.sh start $out/old --port 41300 --no-maintenance --bin /tmp/scan3-base --replicas 3 --view-change-timeout 1s)
enew=$($P/kefir.sh start $out/new --port 41320 --no-maintenance --bin /tmp/scan3-new3 --replicas 3 --view-change-timeout 1s)
cat $out/old/kefir-*.pid >$out/pids-old; cat $out/new/kefir-*.pid >$out/pids-new
Y=/tmp/scan3-ycsb
common=(-db kefir -durability sync -consistency linearizable -workloads a,w -clients 64 -records 10000 -valuesize 1000 -pool 1 -limits-samples 0)
$Y "${common[@]}" -addr $eold -load-only -load-clients 64 >$out/load-old.txt 2>&1
$Y "${common[@]}" -addr $enew -load-only -load-clients 64 >$out/load-new.txt 2>&1
order=(old new)
for r in 1 2 3 4; do
  for s in "${order[@]}"; do
    e=$eold; [ $s = new ] && e=$enew
    echo "round $r $s $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    $Y "${common[@]}" -addr $e -load=false -warmup 1s -d 5s -server-pids $out/pids-$s -json $out/r$r-$s.json >$out/r$r-$s.txt 2>&1
    python3 -c "
import json
for row in json.load(open('$out/r$r-$s.json'))['rows']:
    print('  $s', row['workload'] if 'workload' in row else '', '%.0f ops/s srv %.1f cli %.1f' % (row['result']['ops_per_sec'], row['cost']['server_cpu_us_per_op'], row['result']['process_cpu_us_per_op']))"
  done
  order=("${order[@]:1}" "${order[0]}")
done
$P/kefir.sh stop $out/old; $P/kefir.sh stop $out/new
