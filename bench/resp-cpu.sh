#!/usr/bin/env bash
# Server CPU and context switches per request, Kefir against redis-server, measured with
# `perf stat -p` around one redis-benchmark run each, alternating, after a warm-up of each.
# Throughput on two shared cores is a race with redis-benchmark for CPU; CPU per request
# says which server does less work for the same answers.
#
# Usage: bench/resp-cpu.sh [-b KEFIR_BINARY] [-t set|get] [-P PIPELINE] [-n REQUESTS]
#                          [-d async|sync] [-r ROUNDS]
#   -d sync compares Kefir --durability sync with Redis appendfsync always; async with
#   Redis without persistence. -b compares a given binary (default: built from this tree).
# Needs: go, redis-server, redis-benchmark, perf (Debian: linux-perf).
set -euo pipefail

BIN= T=set P=1 N=200000 DUR=async ROUNDS=3
while getopts "b:t:P:n:d:r:" o; do
	case $o in
	b) BIN=$OPTARG ;; t) T=$OPTARG ;; P) P=$OPTARG ;; n) N=$OPTARG ;; d) DUR=$OPTARG ;; r) ROUNDS=$OPTARG ;;
	*) echo "usage: $0 [-b kefir] [-t set|get] [-P n] [-n requests] [-d async|sync] [-r rounds]" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
for t in redis-server redis-benchmark perf; do
	command -v "$t" >/dev/null || { echo "$0: $t not found (apt-get install redis-server redis-tools linux-perf)" >&2; exit 1; }
done
W=$(mktemp -d /tmp/kefir-cpu.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
if [ -z "$BIN" ]; then BIN=$W/kefir; go build -o "$BIN" ./cmd/kefir; fi
KPORT=${KPORT:-16490} RPORT=${RPORT:-16491}

"$BIN" server --client-addr "127.0.0.1:$KPORT" --peer-addr "" --http-addr "" --dir "$W/kefir-data" \
	--durability "$DUR" --log-level warn 2>"$W/kefir.log" &
KP=$!; PIDS+=("$KP")
if [ "$DUR" = sync ]; then aof=(--appendonly yes --appendfsync always); else aof=(--appendonly no); fi
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$W" --save "" "${aof[@]}" --daemonize no --logfile "$W/redis.log" &
RP=$!; PIDS+=("$RP")
for port in "$KPORT" "$RPORT"; do
	up=
	for _ in $(seq 1 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && { up=1; break; }; sleep 0.1; done
	[ -n "$up" ] || { echo "$0: nothing answers on port $port" >&2; cat "$W"/*.log >&2; exit 1; }
	redis-benchmark -p "$port" -t "$T" -n 100000 -c 50 -P "$P" -q >/dev/null 2>&1 # warm-up
done

one() { # name port pid
	perf stat -e task-clock,context-switches -p "$3" -o "$W/perf" &
	local pp=$! rps
	rps=$(redis-benchmark -p "$2" -t "$T" -n "$N" -c 50 -P "$P" --csv 2>/dev/null | awk -F'","' -v t="\"${T^^}" '$1==t {print $2}')
	kill -INT "$pp"; wait "$pp" 2>/dev/null || true
	awk -v n="$N" -v r="$rps" -v name="$1" '
		/task-clock/ {gsub(",", "", $1); tc=$1}
		/context-switches/ {gsub(",", "", $1); cs=$1}
		END {printf "%-6s rps=%-9d cpu_us/req=%.3f cs/req=%.3f\n", name, r, tc*1000/n, cs/n}' "$W/perf"
}
echo "$T -P $P, durability $DUR, -n $N -c 50, $(date -u +%FT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq 1 "$ROUNDS"); do one kefir "$KPORT" "$KP"; one redis "$RPORT" "$RP"; done
