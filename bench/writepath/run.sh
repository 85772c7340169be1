#!/usr/bin/env bash
# The single-client replicated write's critical path in one run (issue 31 item 1,
# docs/design/write-path.md): this disk's 4 KiB append+fdatasync p50 and loopback TCP
# round trip (bench/limits), the fdatasync of a zero-filled log file with 1, 2 and 3
# files at once (cadbench/fsyncloop: three replicas share one disk here), one client's
# SET p50 on three `kefir server` replicas (redis-benchmark -c 1 -P 1, sync durability)
# with each replica's CAD timeline (-tags cadtrace), and the same write in one process
# with its timeline joined across the replicas.
#
#   bench/writepath/run.sh [--port 43850] [--n 5000] [--dir DIR]
#
# Ports: nine free ones from PORT..PORT+49 (client, peer and HTTP port of each replica;
# the ephemeral range overlaps it here, and a port another process's outgoing connection
# left in TIME-WAIT cannot be bound). Hold the bench lock:
#   flock /tmp/kefir-bench.lock bench/writepath/run.sh
set -euo pipefail
port=43850; n=5000; dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ -n "$dir" ] || dir=$(mktemp -d /tmp/writepath.XXXXXX)
mkdir -p "$dir"
(cd "$root" && go build -tags cadtrace -o "$dir/kefir" ./cmd/kefir)
(cd "$root/bench" && go build -o "$dir/limits" ./writepath/limitsprobe && go build -o "$dir/fsyncloop" ./cadbench/fsyncloop)
free=()
for p in $(seq "$port" $((port + 49))); do
  [ ${#free[@]} -lt 9 ] || break
  python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))" "$p" 2>/dev/null && free+=("$p")
done
[ ${#free[@]} -eq 9 ] || { echo "$0: fewer than 9 free ports in $port..$((port + 49))" >&2; exit 1; }
cport() { echo "${free[$(($1 - 1))]}"; }
pport() { echo "${free[$(($1 + 2))]}"; }
hport() { echo "${free[$(($1 + 5))]}"; }
members=""
for i in 1 2 3; do members+="${members:+,}$i@127.0.0.1:$(pport $i)/127.0.0.1:$(cport $i)"; done
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
for i in 1 2 3; do
  KEFIR_CADTRACE=1 KEFIR_CLUSTER_SECRET=$secret "$dir/kefir" server --node-id "n$i" --dir "$dir/n$i" \
    --client-addr "127.0.0.1:$(cport $i)" --http-addr "127.0.0.1:$(hport $i)" \
    --peer-addr "127.0.0.1:$(pport $i)" --members "$members" --replica-id "$i" \
    --cluster-id 31 --view-change-timeout 1s --bootstrap=true --log-level warn >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
lead=""
for _ in $(seq 100); do
  for i in 1 2 3; do
    if [ "$(curl -fsS "http://127.0.0.1:$(hport $i)/status" 2>/dev/null | jq -r '.replication.role // empty')" = leader ]; then lead=$i; fi
  done
  [ -n "$lead" ] && break
  sleep 0.1
done
[ -n "$lead" ] || { echo "no leader; logs in $dir" >&2; exit 1; }
sleep 1
lp=$(cport "$lead")
redis-benchmark -p "$lp" -c 1 -P 1 -n 500 -t set -q >/dev/null # warm up
for pid in "${pids[@]}"; do kill -USR1 "$pid"; done # start the timelines over
sleep 0.2
echo "== limits (disk of $dir)"
"$dir/limits" "$dir"
# The replicas' log segments are zero-filled ahead (overwrite: no journal commit per
# fdatasync); one, two and three files at once, as the three replicas sync together.
for k in 1 2 3; do
  mkdir -p "$dir/fsyncloop$k"
  "$dir/fsyncloop" -mode overwrite -n "$k" -d 1s -dir "$dir/fsyncloop$k"
  rm -rf "$dir/fsyncloop$k"
done
echo "== one client, sync SET, 3 replicas (leader n$lead)"
redis-benchmark -p "$lp" -c 1 -P 1 -n "$n" -t set -d 128 -r 100000 --precision 3 | grep -A8 "latency summary" || true
for pid in "${pids[@]}"; do kill -USR1 "$pid"; done
sleep 0.5
for i in 1 2 3; do
  echo "== n$i$([ "$i" = "$lead" ] && echo ' (leader)')"
  awk '/^CADTRACE/{b=""} {b=b $0 "\n"} END{printf "%s", b}' "$dir/n$i.log" | grep -v '^CADTRACE'
done
# The same write in one process (three replicas on loopback TCP, the leader's Write, no
# RESP), its timeline joined across leader and followers op by op (one clock): every
# hand-off from Apply to the reply (cadtrace.go traceTimeline).
echo "== in-process: BenchmarkReplicatedSyncWrite/writers=1, -cpu 4, joined timeline"
(cd "$root" && KEFIR_CADTRACE=1 go test -v -tags cadtrace -count=1 -run '^$' \
  -bench 'ReplicatedSyncWrite/writers=1$' -benchtime 3000x -cpu 4 ./internal/vrshard/ 2>&1 |
  sed -n '/timeline of 3000/,/^ok/p' | grep -v '^ok\|^PASS')
