#!/usr/bin/env bash
# The standard YCSB comparison on this machine (issue 8): the harness's ceiling (trivial
# in-process RESP server, driven through Kefir's client), Redis with fsync-always and with
# no persistence, a single Kefir node with sync and async durability, and a 3-member etcd
# cluster — same machine,
# same run, same workloads, same client counts. Everything binds to 127.0.0.1 and is torn
# down at the end (also on failure).
#
#   bench/compare.sh                      # ≈ 25 minutes with the defaults below on a busy 2-core machine
#   WORKLOADS=a,c D=2s RUNS=1 bench/compare.sh    # a quick look
#
# Knobs (environment): WORKLOADS (a,b,c,d,e,f,w), CLIENTS (16,64), RECORDS (50000),
# D (5s measured per cell), W (1s warm-up), RUNS (2: back-to-back repetitions, for the
# 15% agreement check), DELAY (0s: one-way delay on client links), OUT (results/compare). Writes OUT/<system>.md and .json per system
# and OUT/compare.md (all tables, with the commands).
#
# Not yet: ZooKeeper, Redis replicas with WAIT (peers/redis.sh --replicas and
# ycsb -redis-wait exist), delay on peer links.
set -euo pipefail
cd "$(dirname "$0")"

WORKLOADS=${WORKLOADS:-a,b,c,d,e,f,w}
CLIENTS=${CLIENTS:-16,64}
RECORDS=${RECORDS:-50000}
D=${D:-5s}
W=${W:-1s}
RUNS=${RUNS:-2}
DELAY=${DELAY:-0s}
OUT=${OUT:-results/compare}
REDIS_PORT=${REDIS_PORT:-6399}
KEFIR_PORT=${KEFIR_PORT:-6390}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kefir-compare.XXXXXX")
kefir_pid=""
cleanup() {
  [ -n "$kefir_pid" ] && kill "$kefir_pid" 2>/dev/null && wait "$kefir_pid" 2>/dev/null || true
  peers/redis.sh stop "$tmp/redis" >/dev/null 2>&1 || true
  peers/etcd.sh stop "$tmp/etcd" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$OUT"
echo "== build"
go build -o "$tmp/ycsb" ./ycsb
(cd .. && go build -o "$tmp/kefir" ./cmd/kefir)

common=(-workloads "$WORKLOADS" -clients "$CLIENTS" -records "$RECORDS" -d "$D" -warmup "$W" -runs "$RUNS" -delay "$DELAY")
run() { # name ycsb-args...
  local name=$1; shift
  echo "== $name"
  if ! "$tmp/ycsb" "$@" "${common[@]}" -md "$OUT/$name.md" -json "$OUT/$name.json" >/dev/null 2>"$OUT/$name.log"; then
    cat "$OUT/$name.log" >&2
    exit 1
  fi
  grep '^Benchmark' "$OUT/$name.log" >"$OUT/$name.bench" || true # benchstat input
  grep -v '^Benchmark' "$OUT/$name.log" || true
}

run ceiling -db respserver -via kefir

peers/redis.sh start "$tmp/redis" --port "$REDIS_PORT" --fsync always
run redis-fsync-always -db redis -addr "127.0.0.1:$REDIS_PORT" -label "redis(appendfsync always)"
peers/redis.sh stop "$tmp/redis"

peers/redis.sh start "$tmp/redis" --port "$REDIS_PORT" --fsync off
run redis-no-persistence -db redis -addr "127.0.0.1:$REDIS_PORT" -label "redis(no persistence)"
peers/redis.sh stop "$tmp/redis"

"$tmp/kefir" server --dir "$tmp/kefir-data" --client-addr "127.0.0.1:$KEFIR_PORT" --peer-addr "" --http-addr "" \
  >"$tmp/kefir.log" 2>&1 &
kefir_pid=$!
for _ in $(seq 50); do redis-cli -p "$KEFIR_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
run kefir-sync -db kefir -addr "127.0.0.1:$KEFIR_PORT" -durability sync -consistency linearizable
run kefir-async -db kefir -addr "127.0.0.1:$KEFIR_PORT" -durability async -consistency linearizable
kill "$kefir_pid"; wait "$kefir_pid" 2>/dev/null || true; kefir_pid=""

endpoints=$(peers/etcd.sh start "$tmp/etcd" --members 3)
run etcd-3-members -db etcd -addr "$endpoints" -label "etcd(3 members)"
peers/etcd.sh stop "$tmp/etcd"

{
  echo "# YCSB comparison — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "Produced by \`WORKLOADS=$WORKLOADS CLIENTS=$CLIENTS RECORDS=$RECORDS D=$D W=$W RUNS=$RUNS DELAY=$DELAY bench/compare.sh\`."
  echo "Redis fsync-always: appendonly yes, appendfsync always (≈ Kefir sync). Redis no-persistence: no AOF, no RDB."
  echo "Network distance: loopback plus $DELAY each way on every client link (delay proxy), for every system; peer links undelayed."
  echo "Client libraries differ: Redis rows use go-redis (one connection per in-flight request);"
  echo "Kefir and ceiling rows use Kefir's client (pipelines many goroutines' requests over a few"
  echo "connections, fewer syscalls per operation). Part of any gap is the client, not the server."
  echo "etcd: 3 members on loopback, linearizable reads, every commit fsynced by a majority (≈ Kefir sync on 3 replicas; Kefir here is one node)."
  for f in ceiling redis-fsync-always redis-no-persistence kefir-sync kefir-async etcd-3-members; do
    echo; echo "## $f"; echo; cat "$OUT/$f.md"
  done
} >"$OUT/compare.md"
"$tmp/ycsb" -plot "$OUT/plots" "$OUT"/{ceiling,redis-fsync-always,redis-no-persistence,kefir-sync,kefir-async,etcd-3-members}.json >/dev/null
echo "== wrote $OUT/compare.md and $OUT/plots/"
