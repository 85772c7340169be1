#!/usr/bin/env bash
# Side-by-side RESP benchmark: redis-benchmark against a single Kefir node and
# against redis-server (Debian package), both started here on loopback, in two
# durability pairs:
#   no fsync:   redis --appendonly no             vs  kefir --durability async
#   fsync:      redis --appendfsync always        vs  kefir --durability sync
# each with -c 50 and with -c 50 -P 16. Prints a Markdown table with ratios, and one of
# the cost per request (issue 31): the server's CPU µs per request (utime+stime from
# /proc/PID/stat over the redis-benchmark run, SET and GET together), bytes written per
# SET (/proc/PID/io write_bytes) and, for Kefir, fsyncs per SET (its /metrics; /proc has
# no fsync count, so Redis's column says —).
#
# Usage: bench/resp-vs-redis.sh [-n REQUESTS] [-r ROUNDS] [-m IO_MODEL] [-b KEFIR_BINARY]
#   Rounds alternate Kefir and Redis runs, because the machine is shared and
#   single runs are noisy: each round's ratio is printed (with the load average
#   when it ran), and the table gives the medians and the median of the ratios.
#   -m runs Kefir with KEFIR_IO_MODEL=epoll or goroutine (default: the server's).
#   -b runs that kefir binary instead of building ./cmd/kefir (A/B runs of two builds).
# Needs: go, redis-server, redis-benchmark.
set -euo pipefail

N=200000
ROUNDS=1
MODEL=${KEFIR_IO_MODEL:-}
BIN=
while getopts "n:r:m:b:" o; do
	case $o in
	n) N=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	m) MODEL=$OPTARG ;;
	b) BIN=$(realpath "$OPTARG") ;;
	*) echo "usage: $0 [-n requests] [-r rounds] [-m epoll|goroutine] [-b kefir-binary]" >&2; exit 2 ;;
	esac
done

cd "$(dirname "$0")/.."
for t in redis-server redis-benchmark go; do
	command -v "$t" >/dev/null || { echo "$0: $t not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/kefir-bench.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

if [ -n "$BIN" ]; then cp "$BIN" "$WORK/kefir"; else go build -o "$WORK/kefir" ./cmd/kefir; fi

KPORT=${KPORT:-16390}
RPORT=${RPORT:-16391}
HPORT=${HPORT:-16392} # Kefir's HTTP port: /metrics, for its fsync count

wait_port() {
	for _ in $(seq 1 100); do
		if redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; then return 0; fi
		sleep 0.1
	done
	echo "$0: nothing answers on port $1" >&2
	exit 1
}

start_kefir() { # durability
	rm -rf "$WORK/kefir-data"
	KEFIR_IO_MODEL=$MODEL "$WORK/kefir" server --client-addr "127.0.0.1:$KPORT" --peer-addr "" --http-addr "127.0.0.1:$HPORT" \
		--dir "$WORK/kefir-data" --durability "$1" --log-level warn 2>"$WORK/kefir.log" &
	KPID=$!
	PIDS+=("$KPID")
	wait_port "$KPORT"
}

start_redis() { # appendonly appendfsync
	rm -rf "$WORK/redis-data"
	mkdir -p "$WORK/redis-data"
	redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK/redis-data" --save "" \
		--appendonly "$1" --appendfsync "$2" --daemonize no --logfile "$WORK/redis.log" &
	RPID=$!
	PIDS+=("$RPID")
	wait_port "$RPORT"
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# The server's counters (cost per request). ticks: utime+stime in 1/100 s (the fields
# after the command name, which ends the first ")"); wbytes: bytes it caused to be written;
# fsyncs: Kefir's fsync count over every log ("-" without a metrics endpoint).
ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
wbytes() { awk '/^write_bytes:/{print $2}' "/proc/$1/io"; }
fsyncs() {
	if [ "$1" = kefir ]; then
		curl -s "http://127.0.0.1:$HPORT/metrics" | awk '/^kefir_fsync_duration_seconds_count/{s += $2} END{print s + 0}'
	else echo -; fi
}

# bench PORT PIPELINE PID kefir|redis -> "set_rps get_rps cpu_us_per_request bytes_per_set fsyncs_per_set"
bench() {
	local out t0 w0 f0 t1 w1 f1
	t0=$(ticks "$3"); w0=$(wbytes "$3"); f0=$(fsyncs "$4")
	out=$(redis-benchmark -p "$1" -t set,get -n "$N" -c 50 -P "$2" --csv 2>/dev/null)
	t1=$(ticks "$3"); w1=$(wbytes "$3"); f1=$(fsyncs "$4")
	local set get
	set=$(echo "$out" | awk -F'","' '/^"SET"/{print $2}')
	get=$(echo "$out" | awk -F'","' '/^"GET"/{print $2}')
	awk -v s="${set%%.*}" -v g="${get%%.*}" -v n="$N" -v t="$((t1 - t0))" -v w="$((w1 - w0))" -v f0="$f0" -v f1="$f1" \
		'BEGIN { printf "%s %s %.1f %.0f %s\n", s, g, t * 10000 / (2 * n), w / n, (f0 == "-" ? "-" : sprintf("%.3f", (f1 - f0) / n)) }'
}

median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b>0) printf "%.2f", a/b; else print "n/a" }'; }
load() { cut -d' ' -f1 /proc/loadavg; }

declare -A RES
for mode in nofsync fsync; do
	for P in 1 16; do
		ks=(); kg=(); rs=(); rg=(); qs=(); qg=(); kc=(); rc=(); kw=(); rw=(); kf=()
		for i in $(seq 1 "$ROUNDS"); do
			if [ $mode = nofsync ]; then start_kefir async; else start_kefir sync; fi
			read -r s g c w fs < <(bench "$KPORT" "$P" "$KPID" kefir); ks+=("$s"); kg+=("$g"); kc+=("$c"); kw+=("$w"); kf+=("$fs")
			stop "$KPID"
			if [ $mode = nofsync ]; then start_redis no everysec; else start_redis yes always; fi
			read -r s2 g2 c2 w2 _ < <(bench "$RPORT" "$P" "$RPID" redis); rs+=("$s2"); rg+=("$g2"); rc+=("$c2"); rw+=("$w2")
			stop "$RPID"
			qs+=("$(ratio "$s" "$s2")"); qg+=("$(ratio "$g" "$g2")")
			echo "round $i $mode -P $P: SET $s / $s2 = ${qs[-1]}, GET $g / $g2 = ${qg[-1]} (load $(load))" >&2
		done
		RES[$mode,$P,kset]=$(printf '%s\n' "${ks[@]}" | median)
		RES[$mode,$P,kget]=$(printf '%s\n' "${kg[@]}" | median)
		RES[$mode,$P,rset]=$(printf '%s\n' "${rs[@]}" | median)
		RES[$mode,$P,rget]=$(printf '%s\n' "${rg[@]}" | median)
		RES[$mode,$P,qset]=$(printf '%s\n' "${qs[@]}" | median)
		RES[$mode,$P,qget]=$(printf '%s\n' "${qg[@]}" | median)
		RES[$mode,$P,lset]=$(printf '%s ' "${qs[@]}")
		RES[$mode,$P,lget]=$(printf '%s ' "${qg[@]}")
		RES[$mode,$P,kcpu]=$(printf '%s\n' "${kc[@]}" | median)
		RES[$mode,$P,rcpu]=$(printf '%s\n' "${rc[@]}" | median)
		RES[$mode,$P,kw]=$(printf '%s\n' "${kw[@]}" | median)
		RES[$mode,$P,rw]=$(printf '%s\n' "${rw[@]}" | median)
		RES[$mode,$P,kf]=$(printf '%s\n' "${kf[@]}" | median)
	done
done

echo
echo "redis-benchmark -t set,get -n $N -c 50 [-P 16], median of $ROUNDS round(s), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), load $(load), Kefir I/O model ${MODEL:-default}"
echo
echo "| durability | pipeline | op | Kefir req/s | Redis req/s | median of round ratios | round ratios | target |"
echo "|---|---|---|---:|---:|---:|---|---:|"
for mode in nofsync fsync; do
	for P in 1 16; do
		for op in set get; do
			k=${RES[$mode,$P,k$op]}; r=${RES[$mode,$P,r$op]}
			if [ $mode = nofsync ]; then d="kefir async / redis appendonly no"; tgt="≥ 0.8"; else d="kefir sync / redis appendfsync always"; tgt="≥ 1.0"; fi
			echo "| $d | -P $P | ${op^^} | $k | $r | ${RES[$mode,$P,q$op]} | ${RES[$mode,$P,l$op]}| $tgt |"
		done
	done
done
echo
echo "Cost per request (medians over rounds): server CPU µs per request (/proc/PID/stat, SET and GET together; 10 ms ticks),"
echo "write_bytes per SET (/proc/PID/io: page-cache folios dirtied, not disk bytes; bench/README.md), Kefir's fsyncs per SET (/metrics)."
echo "CPU per request barely moves when other work shares the cores; req/s does."
echo
echo "| durability | pipeline | Kefir CPU µs/req | Redis CPU µs/req | Kefir ÷ Redis | Kefir write_bytes/SET | Redis write_bytes/SET | Kefir fsyncs/SET |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for mode in nofsync fsync; do
	for P in 1 16; do
		if [ $mode = nofsync ]; then d="kefir async / redis appendonly no"; else d="kefir sync / redis appendfsync always"; fi
		echo "| $d | -P $P | ${RES[$mode,$P,kcpu]} | ${RES[$mode,$P,rcpu]} | $(ratio "${RES[$mode,$P,kcpu]}" "${RES[$mode,$P,rcpu]}") | ${RES[$mode,$P,kw]} | ${RES[$mode,$P,rw]} | ${RES[$mode,$P,kf]} |"
	done
done
