#!/usr/bin/env bash
# A6 (digest 002 §6.3, issue 30): a chain member against the RPC ceiling of
# the same stack (docs/design/chain.md, "M against the RPC ceiling (A6)").
#
# The thesis compares Flex-KV's memory-only member "M" with a null RPC on the
# same stack. Here: a memory-only chain of one (kefir server --engine chain
# --chain-store memory: its log and engine on an in-memory file system, no
# fsync waited for), its GETs and SETs, against PING — the null RPC — through
# the same RESP front door, from the same client (redis-benchmark), with the
# same connections and pipelining; and for reference a log chain of one (the
# default store: SETs fsynced) and GET on a node that replicates nothing. The
# servers run on CPU 0 and redis-benchmark on CPU 1 (taskset), as digest 002
# §6.2 asks for the CPU-bound experiments; each round runs every test one
# after another, in an order rotated from round to round, because the machine
# is shared; ratios are taken within a round, against that round's PING.
# Each run also gives the server's CPU per request (its utime + stime from
# /proc over the run), which the shared box disturbs less than req/s.
#
# Usage: bench/chain-m-vs-ping.sh [-p BASE_PORT] [-n REQUESTS] [-c CLIENTS] [-r ROUNDS] [-b KEFIR_BINARY] [-a BASE_BINARY] [-t REGEX]
#   Ports BASE (client), BASE+10 (peer), BASE+20 (admin) for the log chain of
#   one; the unreplicated node BASE+1 (client), BASE+21 (admin); the memory
#   chain of one BASE+2 (client), BASE+12 (peer), BASE+22 (admin).
#   -a: A/B — a second memory chain of one from BASE_BINARY (another build:
#   BASE+3, BASE+13, BASE+23), whose PING, GET and SET rows run right after
#   the same tests of -b's, in every round (their ratios: to its own PING).
#   -t: only the rows whose names match REGEX (bash =~), and PING.
#   Prints one line per round and test, then a Markdown table of medians.
set -euo pipefail

BASE=41100
N=200000
CLIENTS=50
ROUNDS=3
BIN=
ABIN=
ONLY=
while getopts "p:n:c:r:b:a:t:" o; do
	case $o in
	p) BASE=$OPTARG ;;
	n) N=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	b) BIN=$OPTARG ;;
	a) ABIN=$OPTARG ;;
	t) ONLY=$OPTARG ;;
	*) exit 2 ;;
	esac
done
WORK=$(mktemp -d)
PID=
cleanup() {
	# shellcheck disable=SC2086
	[ -n "$PID" ] && kill $PID 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$BIN" ]; then
	BIN=$WORK/kefir
	go build -o "$BIN" ./cmd/kefir
fi
export KEFIR_CLUSTER_SECRET=bench-secret
declare -A SPID # client port -> server pid
taskset -c 0 "$BIN" server --engine chain --members "1@127.0.0.1:$((BASE + 10))/127.0.0.1:$BASE" \
	--replica-id 1 --node-id n1 --cluster-id 77 --bootstrap true --dir "$WORK/data" \
	--client-addr "127.0.0.1:$BASE" --peer-addr "127.0.0.1:$((BASE + 10))" \
	--http-addr "127.0.0.1:$((BASE + 20))" --log-level warn >"$WORK/n1.log" 2>&1 &
PID=$!
SPID[$BASE]=$!
# For reference, a node that replicates nothing (no --members): what GET
# costs in the same front door and storage engine without the chain's host.
taskset -c 0 "$BIN" server --node-id plain --dir "$WORK/plain" --client-addr "127.0.0.1:$((BASE + 1))" \
	--http-addr "127.0.0.1:$((BASE + 21))" --log-level warn >"$WORK/plain.log" 2>&1 &
PID="$PID $!"
SPID[$((BASE + 1))]=$!
# memory BINARY PORT: the memory-only member (M), a chain of one with
# --chain-store memory, client port PORT (peer PORT+10, admin PORT+20).
memory() {
	taskset -c 0 "$1" server --engine chain --chain-store memory --chain-log-member=false --members "1@127.0.0.1:$(($2 + 10))/127.0.0.1:$2" \
		--replica-id 1 --node-id "m$2" --cluster-id 78 --bootstrap true --dir "$WORK/mem$2" \
		--client-addr "127.0.0.1:$2" --peer-addr "127.0.0.1:$(($2 + 10))" \
		--http-addr "127.0.0.1:$(($2 + 20))" --log-level warn >"$WORK/m$2.log" 2>&1 &
	PID="$PID $!"
	SPID[$2]=$!
}
memory "$BIN" $((BASE + 2))
PORTS="$BASE $((BASE + 1)) $((BASE + 2))"
if [ -n "$ABIN" ]; then
	memory "$ABIN" $((BASE + 3))
	PORTS="$PORTS $((BASE + 3))"
fi
for port in $PORTS; do
	for _ in $(seq 1 100); do
		redis-cli -p "$port" set warmup 1 >/dev/null 2>&1 && break
		sleep 0.1
	done
	# 10,000 keys of 128 B (the thesis's E7 values) for the GETs to find.
	redis-benchmark -p "$port" -t set -n 20000 -r 10000 -d 128 -c 50 -P 16 -q >/dev/null
done

# rb PORT TEST PIPELINE: requests per second of one redis-benchmark run,
# and the server's CPU µs per request over it.
TCK=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in ticks
rb() {
	local n=$N pid=${SPID[$1]} c0 c1 r
	[ "$2" = set ] && [ "$1" = "$BASE" ] && n=$((N / 4)) # a log chain of one fsyncs every SET batch: fewer, for the same time
	c0=$(cpu "$pid")
	r=$(taskset -c 1 redis-benchmark -p "$1" -t "$2" -n "$n" -r 10000 -d 128 -c "$CLIENTS" -P "$3" --csv |
		awk -F'","' 'NR > 1 {print $2}' | head -1 | tr -d '"')
	c1=$(cpu "$pid")
	echo "$r $(awk -v a="$c0" -v b="$c1" -v n="$n" -v h="$TCK" 'BEGIN {printf "%.2f", (b - a) / h * 1e6 / n}')"
}

# The rows: name, port, redis-benchmark test.
names=("PING (null RPC), chain of one" "GET 128 B, memory chain of one (M)" "SET 128 B, memory chain of one (M)"
	"GET 128 B, log chain of one (D)" "SET 128 B, log chain of one (D, fsync)" "GET 128 B, unreplicated node")
ports=("$BASE" "$((BASE + 2))" "$((BASE + 2))" "$BASE" "$BASE" "$((BASE + 1))")
tests=(ping_mbulk get set get set get)
T=${#names[@]}
if [ -n "$ABIN" ]; then
	names+=("PING, memory chain of one, -a build" "GET 128 B, memory chain of one (M), -a build" "SET 128 B, memory chain of one (M), -a build")
	ports+=("$((BASE + 3))" "$((BASE + 3))" "$((BASE + 3))")
	tests+=(ping_mbulk get set)
fi
A=${#names[@]}
: >"$WORK/rows"
for round in $(seq 1 "$ROUNDS"); do
	load=$(cut -d' ' -f1 /proc/loadavg)
	for k in $(seq 0 $((T - 1))); do
		j=$(((k + round) % T))
		if [ -n "$ONLY" ] && [ "${tests[$j]}" != ping_mbulk ] && ! [[ ${names[$j]} =~ $ONLY ]]; then
			continue
		fi
		js=$j
		# With -a: the other build's memory chain right after this one's,
		# first or second by turns.
		if [ -n "$ABIN" ] && [ "$j" -ge 1 ] && [ "$j" -le 2 ]; then
			js="$j $((T + j))"
			[ $((round % 2)) = 0 ] && js="$((T + j)) $j"
		fi
		[ -n "$ABIN" ] && [ "$j" = 0 ] && js="0 $T"
		for p in 1 16; do
			for i in $js; do
				read -r r us < <(rb "${ports[$i]}" "${tests[$i]}" "$p")
				echo "round $round (load $load): ${names[$i]} -P $p: $r req/s, $us CPU µs/request"
				echo "$i $p $r $round $us" >>"$WORK/rows"
			done
		done
	done
done

echo
echo "| Test ($CLIENTS clients, redis-benchmark) | -P 1: median req/s (rounds) | ÷ PING: median of the rounds' ratios | -P 16: median req/s (rounds) | ÷ PING: median of the rounds' ratios | server CPU µs/request, -P 1 / -P 16 (medians) |"
echo "| --- | --- | --- | --- | --- | --- |"
names_csv=$(printf '%s|' "${names[@]}")
# The -a build's rows are divided by its own PING (its first row).
awk -v names="$names_csv" -v T="$A" -v T0="$T" '
	{ v[$1, $2] = v[$1, $2] " " $3; val[$1, $2, $4] = $3; u[$1, $2] = u[$1, $2] " " $5; if ($4 > R) R = $4 }
	function med(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function gsub_commas(s) { gsub(",", "", s); return s }
	function rounds(s,   a, n, i, o) { n = split(s, a, " "); o = ""; for (i = 1; i <= n; i++) o = o (i > 1 ? ", " : "") sprintf("%.0f", a[i]); return o }
	function ratios(t, p,   r, s, b) { s = ""; b = t >= T0 ? T0 : 0; for (r = 1; r <= R; r++) s = s (r > 1 ? ", " : "") sprintf("%.2f", val[t, p, r] / val[b, p, r]); return s }
	END {
		split(names, name, "|")
		for (t = 0; t < T; t++)
			if (v[t, 1] != "") printf "| %s | %.0f (%s) | **%.2f** (%s) | %.0f (%s) | **%.2f** (%s) | %.2f / %.2f |\n", name[t + 1], med(v[t, 1]), rounds(v[t, 1]), med(gsub_commas(ratios(t, 1))), ratios(t, 1), med(v[t, 16]), rounds(v[t, 16]), med(gsub_commas(ratios(t, 16))), ratios(t, 16), med(u[t, 1]), med(u[t, 16])
	}' "$WORK/rows"
