#!/bin/bash
# The session-5 A/B of the harness (docs/benchmarks-archive.md, YCSB section, "Harness ceiling"):
# for each ycsb binary given, in order, the in-process ceiling via Kefir's client and a
# Kefir node at async, workloads A and C. Build the binaries from bench/ at each commit
# (go build -o BIN ./ycsb), start the node first:
#   bench/peers/kefir.sh start DIR --port 6490 --no-maintenance   (then load it once)
#   flock /tmp/kefir-bench.lock bench/results/ab-harness-s5.sh OLD NEW NEW OLD OLD NEW
C="-clients 64 -records 10000 -valuesize 1000 -warmup 500ms -d 2s -limits-samples 0 -pool 1"
for B in "$@"; do
 for w in a c; do
  echo "$(basename $B) $(GOGC=400 $B -db respserver -via kefir -workloads $w -load-clients 64 $C 2>&1 | grep ops/sec | sed 's/BenchmarkYCSB\///' | awk '{print $1,$3,$(NF-3)}')"
  echo "$(basename $B) $(GOGC=400 $B -db kefir -addr 127.0.0.1:6490 -load=false -durability async -consistency linearizable -workloads $w $C 2>&1 | grep ops/sec | sed 's/BenchmarkYCSB\///' | awk '{print $1,$3,$(NF-3)}')"
 done
done
