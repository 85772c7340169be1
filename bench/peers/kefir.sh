#!/usr/bin/env bash
# Starts and stops Kefir on loopback for the YCSB comparison: a single node, or a VR
# group of N replicas (client ports PORT.., peer ports PORT+100.., HTTP ports PORT+50..,
# whose /metrics URLs it lists in DIR/metrics-urls for ycsb -metrics), started directly with
# `kefir server` (a fresh cluster id and secret each time, --bootstrap on the first start).
# The write durability and read consistency are per call (ycsb -durability/-consistency),
# so one group serves every Kefir row.
#
#   --follower-reads   followers serve cross-client-monotonic reads (every member alike)
#   --view-change-timeout D   how long followers wait for the leader before electing another
#                      (kefir's default 300ms; a CPU-starved shared box needs more, or a
#                      benchmark measures view changes instead of the steady state)
#   --no-maintenance   no background storage maintenance: compaction and the index
#                      checkpoint never run (--compact-interval=-1s --checkpoint-interval=-1s).
#                      Each burns 0.2-0.5 cores for a moment once a minute on this box, which
#                      lands inside some other system's measured cell of the matrix
#                      (compare.sh NO_MAINTENANCE, default on; docs/benchmarks-archive.md, issue 8, "Quiet systems").
#   --delay D          a delay proxy (bench/delaymesh) on every client and peer port; the
#                      member list names the proxies, so replication and forwarding cross
#                      them too. Drive with ycsb -link-delay D.
#
# Usage:
#   bench/peers/kefir.sh start DIR [--replicas 1] [--port 6390] [--follower-reads] [--view-change-timeout 300ms] [--no-maintenance] [--delay 0] [--bin PATH]
#   bench/peers/kefir.sh stop DIR
#
# Prints the client endpoints (comma-separated, leader first). Builds ./cmd/kefir unless
# --bin names a binary. Binds 127.0.0.1 only.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,27p' "$0"; exit 2; }
shift 2
replicas=1; port=6390; follower=false; delay=0; bin=""; vct=300ms; maint=true
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --follower-reads) follower=true; shift ;;
    --no-maintenance) maint=false; shift ;;
    --view-change-timeout) vct=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

stop() { stop_pids "$dir" 'kefir-*.pid'; mesh_stop "$dir"; }

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "unknown command $cmd (start or stop)" >&2; exit 2 ;;
esac

mkdir -p "$dir"
if [ -z "$bin" ]; then
  bin="$dir/kefir"
  (cd "$(dirname "$0")/../.." && go build -o "$bin" ./cmd/kefir)
fi
cport() { echo $((port + $1 - 1)); }
# KEFIR_PEER_OFFSET and KEFIR_HTTP_OFFSET move the peer and HTTP ports (compare.sh PORT_*).
pport() { echo $((port + ${KEFIR_PEER_OFFSET:-100} + $1 - 1)); }
hport() { echo $((port + ${KEFIR_HTTP_OFFSET:-50} + $1 - 1)); }
# addr PORT: what others (clients, peers) dial for PORT.
addr() { if delayed "$delay"; then echo "127.0.0.1:$(proxy_port "$1")"; else echo "127.0.0.1:$1"; fi; }

if delayed "$delay"; then
  ports=()
  for i in $(seq "$replicas"); do ports+=("$(cport "$i")"); [ "$replicas" -gt 1 ] && ports+=("$(pport "$i")"); done
  mesh_start "$dir" "$delay" "${ports[@]}"
fi
members=""; endpoints=""; metrics=""
for i in $(seq "$replicas"); do
  members+="${members:+,}$i@$(addr "$(pport "$i")")/$(addr "$(cport "$i")")"
  endpoints+="${endpoints:+,}$(addr "$(cport "$i")")"
  metrics+="${metrics:+,}http://127.0.0.1:$(hport "$i")/metrics"
done
echo "$metrics" >"$dir/metrics-urls"
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
cluster=$(( ($(od -An -N4 -tu4 /dev/urandom) % 1000000) + 1 ))
for i in $(seq "$replicas"); do
  # The HTTP port serves /metrics: the comparison reads each node's fsync count there
  # (cost per operation); nothing polls it otherwise.
  args=(server --node-id "n$i" --dir "$dir/n$i" --client-addr "127.0.0.1:$(cport "$i")" --http-addr "127.0.0.1:$(hport "$i")" --log-level warn)
  [ "$maint" = true ] || args+=(--compact-interval=-1s --checkpoint-interval=-1s)
  if [ "$replicas" -gt 1 ]; then
    args+=(--peer-addr "127.0.0.1:$(pport "$i")" --members "$members" --replica-id "$i" --cluster-id "$cluster"
      --follower-reads="$follower" --view-change-timeout "$vct")
    [ -d "$dir/n$i" ] || args+=(--bootstrap=true)
  else
    args+=(--peer-addr "")
  fi
  KEFIR_CLUSTER_SECRET=$secret "$bin" "${args[@]}" >"$dir/n$i.log" 2>&1 &
  echo $! >"$dir/kefir-$i.pid"
done
for _ in $(seq 200); do
  up=0
  for i in $(seq "$replicas"); do listening "$(cport "$i")" && up=$((up + 1)); done
  if [ "$up" -eq "$replicas" ]; then
    echo "$endpoints"; exit 0 # the client retries through the first election (ycsb waits on the load)
  fi
  sleep 0.1
done
echo "kefir did not start; see $dir/n*.log" >&2
stop
exit 1
