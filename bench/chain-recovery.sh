#!/usr/bin/env bash
# A8 (digest 002 §6.3, thesis E9/Fig. 6.6, issue 30): memory and recovery of
# chain configurations (docs/design/chain.md, "Memory and recovery (A8)").
#
# The thesis orders M-M, M-D and M (memory-only and log members). Each
# configuration is a list of member stores, head first (kefir server
# --chain-store: d a log, m memory, b buffered): by default M, M-M, M-D and,
# for reference, D, D-D and D-D-D (CONFIGS="m m,m m,d d d,d d,d,d"). For each,
# per round:
#   * memory: every member's RSS (/proc/PID/status VmRSS) before and after
#     loading --records keys of --value-size bytes; bytes of RSS per key;
#   * service gap: kill -9 of the tail, then the time until a write at the
#     head succeeds again (R=1: after restarting the member on its data — a
#     whole chain restarted; a memory member comes back empty; R≥2: with the
#     dead member left down — the master's failure detection and repair);
#   * rejoin: the killed member restarted on its data (R≥2), the time until its
#     /status says "normal" (it copies only what it lacks; a memory member,
#     everything); and after a second kill, restarted on an empty directory
#     (copies everything).
#   * put latency, one client (kefir bench workload w, closed loop, 5 s).
# Configurations alternate within a round.
#
# Usage: bench/chain-recovery.sh [-p BASE_PORT] [-n RECORDS] [-v VALUE_SIZE] [-r ROUNDS] [-b KEFIR_BINARY]
#   Ports BASE .. BASE+29 (clients BASE+0..2, peers BASE+10..12, admin BASE+20..22).
set -euo pipefail

BASE=41200
RECORDS=100000
VSIZE=1000
ROUNDS=2
BIN=
while getopts "p:n:v:r:b:" o; do
	case $o in
	p) BASE=$OPTARG ;;
	n) RECORDS=$OPTARG ;;
	v) VSIZE=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	b) BIN=$OPTARG ;;
	*) exit 2 ;;
	esac
done
WORK=$(mktemp -d)
mkdir -p "$WORK/pid"
stopall() {
	for f in "$WORK"/pid/*; do
		[ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -f "$WORK"/pid/*
}
trap 'stopall; rm -rf "$WORK"' EXIT
if [ -z "$BIN" ]; then
	BIN=$WORK/kefir
	go build -o "$BIN" ./cmd/kefir
fi
export KEFIR_CLUSTER_SECRET=bench-secret
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

# node R I [flags]: starts member I of a chain of R.
# Member I's store is ST[I-1] (set by config).
node() {
	local r=$1 i=$2 m="" logged=false
	shift 2
	# --chain-log-member: whether the chain's configured stores hold a log
	# (d), as kefir up sets it; a memory-only chain answers sync writes.
	for j in $(seq 1 "$r"); do
		case ${ST[$((j - 1))]} in d | log) logged=true ;; esac
	done
	set -- --chain-store "${ST[$((i - 1))]}" --chain-log-member="$logged" "$@"
	for j in $(seq 1 "$r"); do
		m="$m${m:+,}$j@127.0.0.1:$((BASE + 9 + j))/127.0.0.1:$((BASE + j - 1))"
	done
	"$BIN" server --engine chain --members "$m" --replica-id "$i" --node-id "n$i" --cluster-id 77 \
		--dir "$WORK/data/n$i" --client-addr "127.0.0.1:$((BASE + i - 1))" \
		--peer-addr "127.0.0.1:$((BASE + 9 + i))" --http-addr "127.0.0.1:$((BASE + 19 + i))" "$@" \
		>>"$WORK/n$i.log" 2>&1 &
	echo $! >"$WORK/pid/n$i"
}
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$(cat "$WORK/pid/n$1")/status"; }
status() {
	curl -s --max-time 1 "http://127.0.0.1:$((BASE + 19 + $1))/status" 2>/dev/null |
		sed -n 's/^ *"status": "\([a-z]*\)".*/\1/p' | head -1 || true
}
# writable I [SECONDS]: waits until a SET through member I succeeds (each try
# at most 1 s; for 30 s unless said). A deadline, not a count of tries: a
# try at a member still starting (its port closed) fails at once.
writable() {
	local end=$(($(date +%s%N) + ${2:-30} * 1000000000))
	while [ "$(date +%s%N)" -lt "$end" ]; do
		[ "$(timeout 1 redis-cli -p "$((BASE + $1 - 1))" set probe x 2>/dev/null)" = OK ] && return 0
		sleep 0.01
	done
	return 1
}
# normal I: waits until member I's /status says "normal" (at most 60 s).
normal() {
	for _ in $(seq 1 600); do
		[ "$(status "$1")" = normal ] && return 0
		sleep 0.1
	done
	return 1
}

# config STORES ROUND: one configuration's figures, one line (STORES: the
# members' stores, comma-separated, head first).
config() {
	local spec=$1 round=$2 load r label
	IFS=, read -ra ST <<<"$spec"
	r=${#ST[@]}
	label=$(echo "$spec" | tr 'a-z' 'A-Z' | sed 's/,/-/g; s/B/Mb/g')
	load=$(cut -d' ' -f1 /proc/loadavg)
	rm -rf "$WORK/data" "$WORK"/n*.log
	for i in $(seq 1 "$r"); do node "$r" "$i" --bootstrap true; done
	writable 1
	sleep 1
	local before=0 after=0 addrs=""
	for i in $(seq 1 "$r"); do
		before=$((before + $(rss "$i")))
		addrs="$addrs${addrs:+,}127.0.0.1:$((BASE + i - 1))"
	done
	"$BIN" bench --addr "127.0.0.1:$BASE" --load --records "$RECORDS" --value-size "$VSIZE" --workload w \
		--clients 64 --duration 1s --progress=false >/dev/null 2>&1
	sleep 2
	for i in $(seq 1 "$r"); do after=$((after + $(rss "$i"))); done
	local put
	# Workload w has one operation type: the JSON's first percentiles are its.
	put=$("$BIN" bench --addr "127.0.0.1:$BASE" --records "$RECORDS" --value-size "$VSIZE" --workload w \
		--clients 1 --duration 5s --progress=false --json 2>/dev/null |
		awk -F': ' '/"p50_us"/ && !p50 {p50 = $2 + 0} /"p99_us"/ && !p99 {p99 = $2 + 0} END {printf "%.0f / %.0f µs", p50, p99}')
	# The service gap: kill -9 the tail (a chain of one: its only member).
	local v=$r t gap rejoin="— " empty="— "
	kill -9 "$(cat "$WORK/pid/n$v")"
	wait "$(cat "$WORK/pid/n$v")" 2>/dev/null || true
	t=$(now)
	if [ "$r" = 1 ]; then
		# A chain of one restarted is a whole chain restarted: the member
		# comes back waiting to be joined, and the master restarts the chain
		# from it (the longest durable history). Given 15 s.
		node 1 1
		if writable 1 15; then gap="$(since "$t") s"; else gap="never (not writable 15 s after the restart)"; fi
	else
		writable 1
		gap="$(since "$t") s"
		# Restart on its data: rejoins, copying what it lacks.
		t=$(now)
		node "$r" "$v"
		if normal "$v"; then rejoin=$(since "$t"); else rejoin="> 60"; fi
		# Again on an empty directory: copies everything.
		kill -9 "$(cat "$WORK/pid/n$v")"
		wait "$(cat "$WORK/pid/n$v")" 2>/dev/null || true
		sleep 2
		rm -rf "$WORK/data/n$v"
		t=$(now)
		node "$r" "$v"
		if normal "$v"; then empty=$(since "$t"); else empty="> 60"; fi
	fi
	echo "| $round | $label | $load | $((before / r / 1048576)) MiB | $(((after - before) / RECORDS)) B ($(((after - before) / RECORDS / r)) B a member) | $put | ${gap} | ${rejoin} s | ${empty} s |"
	stopall
}

echo "| Round | Chain (head first) | Load avg | RSS a member, empty | RSS per key, all members | Put p50 / p99, one client | Service gap after kill -9 of the tail | Rejoin on its data | Rejoin on an empty dir |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
CONFIGS=${CONFIGS:-m m,m m,d d d,d d,d,d}
for round in $(seq 1 "$ROUNDS"); do
	# The configurations alternate in order from round to round.
	if [ $((round % 2)) = 1 ]; then order=$CONFIGS; else order=$(echo "$CONFIGS" | tr ' ' '\n' | tac | tr '\n' ' '); fi
	for c in $order; do config "$c" "$round"; done
done
