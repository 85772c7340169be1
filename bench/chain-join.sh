#!/usr/bin/env bash
# A2/A3 (digest 002 §6.3, issue 30): a chain's throughput while a member joins
# under load (docs/design/chain.md, "Joins under load (A2, A3)").
#
# A chain of three (kefir server --engine chain, the master hosted by the
# metadata group) is loaded with --records records; each round measures the
# chain's closed-loop maximum (YCSB workload a), then runs two levels, in
# alternating order: open loop at --frac of that maximum (A2) and closed loop at
# the maximum (A3). In each run the middle member (n2) has been killed (kill -9)
# and its directory removed before the run; --join-at seconds into the run it
# is started again on the empty directory and rejoins as a new node, copying the
# whole state from the tail (a snapshot, then the log after it). kefir bench's
# JSON timeline gives the run's throughput in 100 ms buckets, dated by the wall
# clock (bench/chainjoin folds them into seconds, and finds the longest stretch
# with no operation completed in them); the join starts when n2 is started and ends when its /status says
# "normal" (it is a member again). bench/chainjoin turns the runs into a table
# and a plot.
#
# Usage: bench/chain-join.sh [-p BASE_PORT] [-n RECORDS] [-v VALUE_SIZE] [-c CLIENTS]
#          [-d DURATION_S] [-j JOIN_AT_S] [-f FRACTION] [-r ROUNDS] [-o OUT_DIR] [-b KEFIR_BINARY]
#   Ports BASE .. BASE+29 (clients BASE+0..2, peers BASE+10..12, admin BASE+20..22).
#   OUT_DIR gets run-*.json (one per run), logs-*/ (the members' logs of each
#   run), table.md and join.svg.
set -euo pipefail

BASE=41000
RECORDS=200000
VSIZE=1000
CLIENTS=32
DUR=40
JOIN_AT=10
FRAC=0.3
ROUNDS=2
OUT=bench/results/chain-join
BIN=
while getopts "p:n:v:c:d:j:f:r:o:b:" o; do
	case $o in
	p) BASE=$OPTARG ;;
	n) RECORDS=$OPTARG ;;
	v) VSIZE=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	d) DUR=$OPTARG ;;
	j) JOIN_AT=$OPTARG ;;
	f) FRAC=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	o) OUT=$OPTARG ;;
	b) BIN=$OPTARG ;;
	*) exit 2 ;;
	esac
done
WORK=$(mktemp -d)
mkdir -p "$WORK/pid"
cleanup() {
	for f in "$WORK"/pid/*; do
		[ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$BIN" ]; then
	BIN=$WORK/kefir
	go build -o "$BIN" ./cmd/kefir
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT"/run-*.json "$OUT"/logs-*
export KEFIR_CLUSTER_SECRET=bench-secret
M=""
for i in 1 2 3; do
	M="$M${M:+,}$i@127.0.0.1:$((BASE + 9 + i))/127.0.0.1:$((BASE + i - 1))"
done
ADDRS=127.0.0.1:$BASE,127.0.0.1:$((BASE + 2)) # n1 and n3: up through every run

# node I [--bootstrap true]: starts member I (a restart appends to its log).
node() {
	local i=$1
	shift
	"$BIN" server --engine chain --members "$M" --replica-id "$i" --node-id "n$i" --cluster-id 77 \
		--dir "$WORK/data/n$i" --client-addr "127.0.0.1:$((BASE + i - 1))" \
		--peer-addr "127.0.0.1:$((BASE + 9 + i))" --http-addr "127.0.0.1:$((BASE + 19 + i))" "$@" \
		>>"$WORK/n$i.log" 2>&1 &
	echo $! >"$WORK/pid/n$i"
}

# status I: member I's replication status (normal, recovering, ...), or nothing.
status() {
	curl -s --max-time 1 "http://127.0.0.1:$((BASE + 19 + $1))/status" 2>/dev/null |
		sed -n 's/^ *"status": "\([a-z]*\)".*/\1/p' | head -1 || true # not up yet: nothing
}

now() { date +%s.%N; }

rm -rf "$WORK/data"
for i in 1 2 3; do node "$i" --bootstrap true; done
for _ in $(seq 1 100); do
	redis-cli -p "$BASE" set warmup 1 >/dev/null 2>&1 && break
	sleep 0.1
done
echo "loading $RECORDS records of $VSIZE B..."
"$BIN" bench --addr "127.0.0.1:$BASE" --load --records "$RECORDS" --value-size "$VSIZE" --workload a \
	--clients 64 --duration 1s --progress=false 2>&1 | grep -E "loaded|ops/s \(" || true

# heal: every member serving as before. On this shared box a member's process
# can stall past the master's 1 s failure timeout (seen once: n1 silent for
# 1.8 s, 30 s after a join); the master then repairs the chain around it and
# fences it until its process restarts. Such a member is restarted on its data
# (it rejoins), so that every run starts from the same chain, and it is said.
# A member the master repaired out while it ran says "removed" on /status
# (before session 24 it went on saying "normal", and heal missed it).
heal() {
	local i st
	for i in 1 2 3; do
		# A busy member may not answer /status within its 1 s: only a member
		# that says it is not serving, or is silent for 5 tries, is restarted.
		for _ in 1 2 3 4 5; do
			st=$(status "$i")
			[ -n "$st" ] && break
			sleep 1
		done
		[ "$st" = normal ] && continue
		echo "n$i is not serving (${st:-no answer}): restarted on its data to rejoin" >&2
		kill -9 "$(cat "$WORK/pid/n$i")" 2>/dev/null || true
		wait "$(cat "$WORK/pid/n$i")" 2>/dev/null || true
		node "$i"
		for _ in $(seq 1 600); do
			[ "$(status "$i")" = normal ] && break
			sleep 0.1
		done
	done
	# A rejoined member joins just before the tail, so the chain's order may
	# differ from [1 2 3] after a heal; the client finds the head by itself.
	sleep 2
}

# sample CLIENT_PID: every 0.5 s, each member's and the client's CPU time so
# far (utime + stime, clock ticks) as "UNIX_TIME NAME TICKS" lines in
# $WORK/cpu, while $WORK/sampling exists: who takes the 2 cores during a join.
sample() {
	local t i p
	while [ -e "$WORK/sampling" ]; do
		t=$(now)
		for i in 1 2 3 client; do
			if [ "$i" = client ]; then p=$1; else p=$(cat "$WORK/pid/n$i"); fi
			awk -v t="$t" -v n="$i" '{print t, n, $14 + $15}' "/proc/$p/stat" 2>/dev/null >>"$WORK/cpu" || true
		done
		sleep 0.5
	done
}

# run ROUND LEVEL RATE MAX: one run with n2's join; writes $OUT/run-ROUND-LEVEL.json.
run() {
	local round=$1 level=$2 rate=$3 max=$4
	local out=$OUT/run-$round-$level.json
	heal
	kill -9 "$(cat "$WORK/pid/n2")"
	wait "$(cat "$WORK/pid/n2")" 2>/dev/null || true # reaped here: no "Killed" from the shell
	local killed
	killed=$(now)
	sleep 3 # the master declares n2 failed after 1 s and repairs the chain around it
	rm -rf "$WORK/data/n2"
	: >"$WORK/n2.log"
	local load
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	"$BIN" bench --addr "$ADDRS" --records "$RECORDS" --value-size "$VSIZE" --workload a \
		--clients "$CLIENTS" --rate "$rate" --warmup 2s --duration "${DUR}s" --json --progress=false --interval 100ms \
		>"$WORK/bench.json" 2>"$WORK/bench.err" &
	local bpid=$!
	: >"$WORK/cpu"
	touch "$WORK/sampling"
	sample "$bpid" &
	local spid=$!
	sleep $((JOIN_AT + 2))
	local start end="" st
	start=$(now)
	node 2
	for _ in $(seq 1 $((DUR * 10))); do
		st=$(status 2)
		if [ "$st" = normal ]; then
			end=$(now)
			break
		fi
		sleep 0.1
	done
	wait "$bpid" || echo "kefir bench: $(tail -3 "$WORK/bench.err")" >&2
	rm -f "$WORK/sampling"
	wait "$spid" || true
	# The master's "joining" and the joiner's "restored snapshot" lines, for
	# the record (their log times are UTC, RFC 3339).
	local mj snap
	mj=$(grep -h 'chain master: joining' "$WORK"/n1.log "$WORK"/n3.log | tail -1 | sed -n 's/^time=\([^ ]*\).*/\1/p')
	snap=$(grep -h 'restored snapshot' "$WORK/n2.log" | tail -1 | sed -n 's/^time=\([^ ]*\).*/\1/p')
	{
		printf '{"round": %s, "level": "%s", "target_rate": %s, "max_rate": %s, "load_avg": "%s",\n' \
			"$round" "$level" "$rate" "$max" "$load"
		printf ' "killed_unix": %s, "join_start_unix": %s, "join_end_unix": %s,\n' "$killed" "$start" "${end:-0}"
		printf ' "master_joining": "%s", "snapshot_restored": "%s",\n' "$mj" "$snap"
		printf ' "clk_tck": %s, "cpu": [%s],\n "bench": ' "$(getconf CLK_TCK)" \
			"$(awk '{printf "%s[%s, \"%s\", %s]", (NR > 1 ? ", " : ""), $1, $2, $3}' "$WORK/cpu")"
		cat "$WORK/bench.json"
		printf '}\n'
	} >"$out"
	# Every member's log of the run, beside its figures (then emptied).
	mkdir -p "$OUT/logs-$round-$level"
	for i in 1 2 3; do
		cp "$WORK/n$i.log" "$OUT/logs-$round-$level/"
		: >"$WORK/n$i.log"
	done
	echo "round $round $level (rate $rate, load $load): join $(awk -v s="$start" -v e="${end:-0}" 'BEGIN{if (e>0) printf "%.1f s", e-s; else print "did not end"}')"
	[ -n "$end" ] || {
		echo "n2 did not rejoin; its log:" >&2
		tail -20 "$OUT/logs-$round-$level/n2.log" >&2
		exit 1
	}
	sleep 2
}

for round in $(seq 1 "$ROUNDS"); do
	heal
	max=$("$BIN" bench --addr "$ADDRS" --records "$RECORDS" --value-size "$VSIZE" --workload a \
		--clients "$CLIENTS" --warmup 2s --duration 10s --json --progress=false 2>/dev/null |
		sed -n 's/^    "ops_per_sec": \([0-9]*\).*/\1/p' | head -1 || true)
	if [ "${max:-0}" -lt 100 ]; then
		echo "round $round: the maximum could not be measured (${max:-nothing}): stopping" >&2
		exit 1
	fi
	rate=$(awk -v m="$max" -v f="$FRAC" 'BEGIN{printf "%d", m*f}')
	echo "== round $round: max $max ops/s (closed loop, $CLIENTS clients), low level $rate ops/s"
	if [ $((round % 2)) = 1 ]; then
		run "$round" low "$rate" "$max"
		run "$round" max 0 "$max"
	else
		run "$round" max 0 "$max"
		run "$round" low "$rate" "$max"
	fi
done
(cd bench && go run ./chainjoin -md "$OUT/table.md" -plot "$OUT/join.svg" "$OUT"/run-*.json) ||
	echo "bench/chainjoin failed: the runs are in $OUT" >&2
