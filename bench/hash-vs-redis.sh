#!/usr/bin/env bash
# Issue 27's hash acceptance: redis-benchmark's SET, GET, HSET, HGET and an HSET of 10
# fields against Kefir (a single node or a VR group, default levels, via peers/kefir.sh)
# and redis-server (no persistence), rounds alternating Kefir and Redis because the box
# is shared. Each test is its own redis-benchmark run, so that the server's CPU per
# request (utime+stime of every Kefir replica, /proc/PID/stat, 10 ms ticks) is the
# test's own. Prints each round and then the medians: requests per second, the ratio
# Kefir/Redis and CPU µs per request. HSET and HGET are redis-benchmark's own
# (one hash "myhash", fields element:__rand_int__); hset10 sets 10 such fields per call
# (REQUESTS/10 calls).
#
# Usage: bench/hash-vs-redis.sh [-g REPLICAS] [-P PIPELINE] [-n REQUESTS] [-r ROUNDS]
#                              [-p PORT] [-b KEFIR_BINARY]
#   -p: the first of ~60 ports (Kefir clients p.., peers p+30.., HTTP p+50..; Redis p+20).
# Needs: go, redis-server, redis-benchmark.
set -euo pipefail

G=1 P=16 N=200000 ROUNDS=3 PORT=16600 BIN=
while getopts "g:P:n:r:p:b:" o; do
	case $o in
	g) G=$OPTARG ;; P) P=$OPTARG ;; n) N=$OPTARG ;; r) ROUNDS=$OPTARG ;; p) PORT=$OPTARG ;; b) BIN=$(realpath "$OPTARG") ;;
	*) sed -n '2,15p' "$0" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
W=$(mktemp -d /tmp/kefir-hash.XXXXXX)
RPID=
cleanup() {
	KEFIR_PEER_OFFSET=30 bench/peers/kefir.sh stop "$W/k" >/dev/null 2>&1 || true
	[ -n "$RPID" ] && kill "$RPID" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT
if [ -z "$BIN" ]; then BIN=$W/kefir; go build -o "$BIN" ./cmd/kefir; fi
RPORT=$((PORT + 20))
# The ports are in the kernel's ephemeral range on most boxes: one an outgoing connection
# holds (redis-benchmark's, TIME_WAIT) fails the bind, so a failed start is tried again.
for try in 1 2 3 4; do
	KEFIR_PEER_OFFSET=30 bench/peers/kefir.sh start "$W/k" --replicas "$G" --port "$PORT" --bin "$BIN" --no-maintenance \
		--view-change-timeout 2s \
		>/dev/null 2>"$W/start.err" && break
	[ "$try" = 4 ] && { cat "$W/start.err"; tail -n 5 "$W"/k/n*.log; exit 1; } >&2
	rm -rf "$W/k"
	sleep 5
done
KPIDS=$(cat "$W"/k/kefir-*.pid)
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$W" --save "" --appendonly no --daemonize no --logfile "$W/redis.log" &
RPID=$!
for port in "$PORT" "$RPORT"; do
	for _ in $(seq 1 300); do redis-cli -p "$port" set warm 1 2>/dev/null | grep -q OK && break; sleep 0.1; done
done

F=element:__rand_int__
declare -A ARGS=(
	[set]="-t set" [get]="-t get" [hset]="-t hset"
	[hget]="hget myhash $F"
	[hset10]="hset myhash10 $F a $F b $F c $F d $F e $F f $F g $F h $F i $F j"
)
TESTS="set get hset hget hset10"
ticks() { local s=0 p; for p in $1; do s=$((s + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done; echo $s; }
one() { # port pids test -> "rps cpu_us_per_req"
	local t0 t1 rps n=$N
	[ "$3" = hset10 ] && n=$((N / 10)) # as many fields as the others' requests
	t0=$(ticks "$2")
	# shellcheck disable=SC2086
	rps=$(redis-benchmark -p "$1" -n "$n" -c 50 -P "$P" -r 100000 --csv ${ARGS[$3]} 2>/dev/null | tail -1 | awk -F'","' '{print $2}')
	t1=$(ticks "$2")
	awk -v r="$rps" -v t=$((t1 - t0)) -v n="$n" 'BEGIN {printf "%d %.2f\n", r, t * 10000 / n}'
}
# Fill the hashes first (redis-benchmark's HSET is mostly overwrites once warm).
for port in "$PORT" "$RPORT"; do
	redis-benchmark -p "$port" -n 200000 -c 50 -P 16 -r 100000 -q -t hset >/dev/null 2>&1 || true
	# shellcheck disable=SC2086
	redis-benchmark -p "$port" -n 20000 -c 50 -P 16 -r 100000 -q ${ARGS[hset10]} >/dev/null 2>&1 || true
done
echo "Kefir $G replica(s), default levels; redis-server $(redis-server --version | awk '{print $3}') no persistence;" \
	"redis-benchmark -n $N -c 50 -P $P -r 100000; $(date -u +%FT%H:%MZ)"
for r in $(seq "$ROUNDS"); do
	for t in $TESTS; do
		k=$(one "$PORT" "$KPIDS" "$t")
		x=$(one "$RPORT" "$RPID" "$t")
		echo "round $r $t kefir $k redis $x load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$W/rounds"
	done
done
echo
echo "| test | Kefir req/s | Redis req/s | ratio | Kefir CPU µs/req | Redis CPU µs/req |"
echo "| --- | --- | --- | --- | --- | --- |"
med() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for t in $TESTS; do
	col() { awk -v t="$t" -v c="$1" '$3 == t {print (c == "ratio") ? $5 / $8 : $c}' "$W/rounds" | med; }
	printf "| %s | %.0f | %.0f | %.2f | %.2f | %.2f |\n" "$t" "$(col 5)" "$(col 8)" "$(col ratio)" "$(col 6)" "$(col 9)"
done
