#!/usr/bin/env bash
# User and system CPU per request of single Kefir nodes (two builds, A/B) and redis-server,
# under one redis-benchmark test at a time: each binary gets a fresh server, filled first
# (SET, or HSET for the hash tests, 300,000 requests over the same -r keyspace), then the
# test runs and /proc/PID/stat's utime and stime over it give µs per request, apart (a
# load that adds kernel time, such as a client woken at every reply, shows in sys). The
# binaries alternate within a round. docs/design/hashes.md ("Pipelined, session 21") used it.
#
# Usage: bench/cpu-ab.sh [-t TEST] [-n REQUESTS] [-P PIPELINE] [-r KEYSPACE] [-R ROUNDS] [-p PORT] BIN...
#   TEST: a redis-benchmark test (set, get, hset, ...) or hget (HGET myhash element:__rand_int__).
#   -r: redis-benchmark's -r (default 100000; 0: one key, no fill).
#   BIN: a kefir binary (run with --durability async), or the word "redis" (no persistence).
# Needs: redis-server, redis-benchmark, redis-cli.
set -euo pipefail

TEST=get N=1000000 PIPE=16 RAND=100000 ROUNDS=3 PORT=27680
while getopts "t:n:P:r:R:p:" o; do
	case $o in
	t) TEST=$OPTARG ;; n) N=$OPTARG ;; P) PIPE=$OPTARG ;; r) RAND=$OPTARG ;; R) ROUNDS=$OPTARG ;; p) PORT=$OPTARG ;;
	*) sed -n '2,13p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
for t in redis-server redis-benchmark redis-cli; do
	command -v $t >/dev/null || { echo "cpu-ab: $t not found (apt-get install redis-server redis-tools)" >&2; exit 2; }
done
W=$(mktemp -d /tmp/cpu-ab.XXXX)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"' EXIT

r=() fill=set t=(-t "$TEST")
[ "$RAND" -gt 0 ] && r=(-r "$RAND")
case $TEST in hset | hget) fill=hset ;; esac
[ "$TEST" = hget ] && t=(hget myhash element:__rand_int__)
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; } # utime stime (after the comm field, which has no spaces here)

echo "redis-benchmark -c 50 -P $PIPE -n $N ${r[*]} ${t[*]}; µs per request"
for round in $(seq "$ROUNDS"); do
	for bin in "$@"; do
		d=$W/data.$round.$RANDOM
		mkdir -p "$d"
		if [ "$bin" = redis ]; then
			redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$d" >/dev/null 2>&1 &
		else
			"$bin" server --client-addr 127.0.0.1:"$PORT" --peer-addr "" --http-addr "" --dir "$d" --durability async >/dev/null 2>&1 &
		fi
		PID=$!
		for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
		[ "$RAND" -gt 0 ] && redis-benchmark -p "$PORT" -n 300000 -c 50 -P 16 "${r[@]}" -q -t $fill >/dev/null 2>&1
		read -r u0 s0 < <(ticks "$PID")
		rps=$(redis-benchmark -p "$PORT" -n "$N" -c 50 -P "$PIPE" "${r[@]}" --csv "${t[@]}" 2>/dev/null | tail -1 | awk -F'","' '{print $2}')
		read -r u1 s1 < <(ticks "$PID")
		awk -v name="$(basename "$bin")" -v rnd="$round" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$N" -v r="$rps" \
			'BEGIN {printf "round %s %-12s req/s %9.0f  user %.2f  sys %.2f  total %.2f\n", rnd, name, r, u*10000/n, s*10000/n, (u+s)*10000/n}'
		kill "$PID"; wait "$PID" 2>/dev/null || true
		PID=
		rm -rf "$d"
	done
done
