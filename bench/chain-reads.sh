#!/usr/bin/env bash
# Strong reads on a chain at one member or spread over every member
# (docs/design/chain.md, "Reads at any member on the host"): a chain of
# three log members (D-D-D, SU, a standalone master) holding 1,000 records
# of 1 KB; three kefir bench processes of YCSB workload c (100 %
# linearizable reads, zipfian), each with CLIENTS clients on one member's
# front door:
#   spread  — one process per member (n1, n2, n3),
#   client  — each process on all three, the Go client spreading its
#             reads over them (kefir bench --chain-reads: WithChainReads),
#   tail    — all three at the tail (n3),
#   head    — all three at the head (n1);
# alone, and with a fourth process of 4 clients writing (workload w, sync
# updates of the same records) at the head throughout. Each run's reads/s
# and writes/s (summed), the readers' read p50, and the servers' CPU per
# operation (user + system time of the three members and the master over
# the run, from /proc, divided by the reads and writes completed), and the
# tail's own CPU and bytes read and written on its sockets and files
# (/proc/PID/io rchar + wchar) per read: what a read of a key dirty at
# another member costs the tail — forwarded whole before the version query,
# a KEFIR.CHAINVERSION round trip with it. With -o
# OLD_BINARY, also "spread" on another build (session 27: 3e84756, where a
# read at another member went to the head; session 28: b9c4b4d, before the
# version query, where a read of a key dirty at a member is forwarded whole
# to the tail). Rounds
# alternate the configurations (the machine is shared); the
# summary gives each figure's median over the rounds.
#
# Usage: bench/chain-reads.sh [-p BASE_PORT] [-d DURATION] [-r ROUNDS] [-b KEFIR_BINARY] [-o OLD_BINARY] [-c CLIENTS] [-w "WRITERS..."] [-n RECORDS] [-P "PLACEMENTS..."]
#   -w: the writer counts to run (default "0 4"); -n: records (default 1000:
#   about 1 % of the reads find their key dirty with 4 writers; 10 makes a
#   write in flight on a read's key common, which the version query is for);
#   -P: the placements to run (default "spread client tail head").
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
set -euo pipefail

BASE=42700
DUR=5s
ROUNDS=3
OLD=
CLIENTS=8
WRITERS="0 4"
RECORDS=1000
PLACES="spread client tail head"
# Our own flags first; chain-lib.sh parses -p -d -r -b.
args=()
while [ $# -gt 0 ]; do
	case $1 in
	-o) OLD=$2; shift 2 ;;
	-c) CLIENTS=$2; shift 2 ;;
	-w) WRITERS=$2; shift 2 ;;
	-n) RECORDS=$2; shift 2 ;;
	-P) PLACES=$2; shift 2 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
# shellcheck source=bench/chain-lib.sh
. "$(dirname "$0")/chain-lib.sh"
NEW=$BIN

# cpu: the summed user+system clock ticks of the processes in $WORK/pids.
cpu() {
	local t=0 p f
	for p in $(cat "$WORK/pids"); do
		if [ -r "/proc/$p/stat" ]; then
			# Fields 14 and 15 (utime, stime), after the command's ")".
			f=$(sed 's/.*) //' "/proc/$p/stat")
			t=$((t + $(echo "$f" | awk '{print $12 + $13}')))
		fi
	done
	echo "$t"
}

# tailstat: the tail's (the last process started: n3) CPU ticks and bytes
# read and written (rchar + wchar).
tailstat() {
	local p f
	p=$(tail -n 1 "$WORK/pids")
	f=$(sed 's/.*) //' "/proc/$p/stat")
	echo "$(echo "$f" | awk '{print $12 + $13}') $(awk '/^rchar|^wchar/ {s += $2} END {print s}' "/proc/$p/io")"
}

# run NAME BINARY PLACEMENT WRITERS: PLACEMENT is "spread", "client", "tail" or
# "head"; WRITERS > 0 adds a fourth process, WRITERS clients of workload w
# (sync updates) at the head, for the whole run. Appends "NAME<TAB>reads/s
# <TAB>writes/s<TAB>CPU µs/op (over reads and writes)<TAB>read p50 µs (the
# mean of the three readers')<TAB>load" to $WORK/results.
run() {
	local name=$1 bin=$2 place=$3 writers=$4 addrs a0 a1 a2 c0 c1 t0 t1 i targets more=
	BIN=$bin
	addrs=$(start chain 3 su)
	IFS=, read -r a0 a1 a2 <<<"$addrs"
	"$BIN" bench --addr "$a0" --progress=false --duration 1s --load --records "$RECORDS" --workload c \
		--clients 4 --json >/dev/null
	case $place in
	spread) targets="$a0 $a1 $a2" ;;
	client)
		# One connection per member and process (the client keeps --pool per
		# address it spreads over): 9 in all, where "spread" has 12 (4 per
		# process on one member). With --pool 4 it had 36, each with less
		# than one read in flight, and paid a syscall per read.
		targets="$addrs $addrs $addrs" more="--chain-reads --pool 1"
		;;
	tail) targets="$a2 $a2 $a2" ;;
	head) targets="$a0 $a0 $a0" ;;
	esac
	rm -f "$WORK"/read*.json "$WORK"/write.json
	c0=$(cpu)
	t0=$(tailstat)
	i=0
	for a in $targets; do
		"$BIN" bench --addr "$a" --progress=false --duration "$DUR" --records "$RECORDS" --workload c \
			--consistency linearizable --clients "$CLIENTS" --seed $((i + 1)) $more --json >"$WORK/read$i.json" &
		i=$((i + 1))
	done
	if [ "$writers" -gt 0 ]; then
		"$BIN" bench --addr "$a0" --progress=false --duration "$DUR" --records "$RECORDS" --workload w \
			--durability sync --clients "$writers" --seed 9 --json >"$WORK/write.json" &
	fi
	wait $(jobs -p)
	c1=$(cpu)
	# Where the members' strong reads went (their counters over the run,
	# the load included): clean, at the tail's version, sent to the tail,
	# of those after a failed query or a long wait, waited at the tail; of
	# the version reads, those answered from a held update and those that
	# waited for this member's apply, and the version queries sent (0 on a
	# build without the counters).
	for i in 1 2 3; do
		curl -s "http://127.0.0.1:$((BASE + 19 + i))/metrics" | awk -v n="n$i" '
			/^kefir_chain_reads_clean_total/ {c=$2} /^kefir_chain_reads_version_total/ {v=$2}
			/^kefir_chain_reads_to_tail_total/ {t=$2} /^kefir_chain_reads_version_fallbacks_total/ {f=$2}
			/^kefir_chain_reads_waited_total/ {w=$2} /^kefir_chain_reads_held_total/ {h=$2}
			/^kefir_chain_version_queries_sent_total/ {q=$2} /^kefir_chain_reads_version_waited_total/ {vw=$2}
			END {printf "  %s: clean %d, version %d (held %d, waited for apply %d, queries %d), to tail %d (fallbacks %d), waited %d\n", n, c, v, h, vw, q, t, f, w}'
	done
	t1=$(tailstat)
	python3 - "$name" "$((c1 - c0))" "$(getconf CLK_TCK)" "$(cut -d' ' -f1 /proc/loadavg)" "$WORK" "$t0" "$t1" <<'PY' | tee -a "$WORK/results"
import glob, json, os, sys
name, ticks, hz, load, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
(tt0, tb0), (tt1, tb1) = (map(int, a.split()) for a in sys.argv[6:8])
reads = writes = total = nreads = 0
p50s = []
for path in sorted(glob.glob(os.path.join(work, "read*.json"))) + glob.glob(os.path.join(work, "write.json")):
    r = json.load(open(path))["run"]
    if r["errors"]:
        sys.exit(f"{name}: {r['errors']} errors: {r.get('first_errors')}")
    total += r["ops"]
    for o in r["per_op"]:
        if o["op"].upper() == "READ":
            reads += o["ops_per_sec"]
            nreads += o["count"]
            p50s.append(o["p50_us"])
        else:
            writes += o["ops_per_sec"]
cpu_us = ticks / hz * 1e6 / total if total else 0
p50 = sum(p50s) / len(p50s) if p50s else 0
tail_us = (tt1 - tt0) / hz * 1e6 / nreads if nreads else 0
tail_b = (tb1 - tb0) / nreads if nreads else 0
print(f"{name}\t{reads:.0f}\t{writes:.0f}\t{cpu_us:.1f}\t{p50:.0f}\t{tail_us:.1f}\t{tail_b:.0f}\tload {load}")
PY
	stop
}

: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
	echo "== round $round"
	for w in $WRITERS; do
		for place in $PLACES; do
			case $place in
			spread) run "writers $w, reads spread over n1 n2 n3" "$NEW" spread "$w" ;;
			client) run "writers $w, reads spread by the client (--chain-reads)" "$NEW" client "$w" ;;
			tail) run "writers $w, reads all at the tail" "$NEW" tail "$w" ;;
			head) run "writers $w, reads all at the head" "$NEW" head "$w" ;;
			esac
		done
		if [ -n "$OLD" ]; then
			run "writers $w, reads spread over n1 n2 n3, the -o binary" "$OLD" spread "$w"
		fi
	done
done
echo "== medians over $ROUNDS rounds (reads/s, writes/s, server CPU µs/op, read p50 µs, tail CPU µs/read, tail bytes/read)"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *f, _ = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append([float(x) for x in f])
for name, rs in rows.items():
    m = [statistics.median(r[i] for r in rs) for i in range(6)]
    print(f"{name}: reads {m[0]:,.0f}/s, writes {m[1]:,.0f}/s, server CPU {m[2]:.1f} µs/op, read p50 {m[3]:,.0f} µs, tail CPU {m[4]:.1f} µs/read, tail {m[5]:,.0f} B/read")
PY
