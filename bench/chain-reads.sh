#!/usr/bin/env bash
# Strong reads on a chain at one member or spread over every member
# (docs/design/chain.md, "Reads at any member on the host"): a chain of
# three log members (D-D-D, SU, a standalone master) holding 1,000 records
# of 1 KB; three kefir bench processes of YCSB workload c (100 %
# linearizable reads, zipfian), each with CLIENTS clients on one member's
# front door:
#   spread  — one process per member (n1, n2, n3),
#   tail    — all three at the tail (n3),
#   head    — all three at the head (n1);
# alone, and with a fourth process of 4 clients writing (workload w, sync
# updates of the same records) at the head throughout. Each run's reads/s
# and writes/s (summed), the readers' read p50, and the servers' CPU per
# operation (user + system time of the three members and the master over
# the run, from /proc, divided by the reads and writes completed). With -o
# OLD_BINARY, also "spread" on a build from before the change, where a read
# at another member goes to the head (the Go client, told -MOVED, sends it
# there). Rounds alternate the configurations (the machine is shared); the
# summary gives each figure's median over the rounds.
#
# Usage: bench/chain-reads.sh [-p BASE_PORT] [-d DURATION] [-r ROUNDS] [-b KEFIR_BINARY] [-o OLD_BINARY] [-c CLIENTS]
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
set -euo pipefail

BASE=42700
DUR=5s
ROUNDS=3
OLD=
CLIENTS=8
# Our own flags first; chain-lib.sh parses -p -d -r -b.
args=()
while [ $# -gt 0 ]; do
	case $1 in
	-o) OLD=$2; shift 2 ;;
	-c) CLIENTS=$2; shift 2 ;;
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

# run NAME BINARY PLACEMENT WRITERS: PLACEMENT is "spread", "tail" or
# "head"; WRITERS > 0 adds a fourth process, WRITERS clients of workload w
# (sync updates) at the head, for the whole run. Appends "NAME<TAB>reads/s
# <TAB>writes/s<TAB>CPU µs/op (over reads and writes)<TAB>read p50 µs (the
# mean of the three readers')<TAB>load" to $WORK/results.
run() {
	local name=$1 bin=$2 place=$3 writers=$4 addrs a0 a1 a2 c0 c1 i targets
	BIN=$bin
	addrs=$(start chain 3 su)
	IFS=, read -r a0 a1 a2 <<<"$addrs"
	"$BIN" bench --addr "$a0" --progress=false --duration 1s --load --records 1000 --workload c \
		--clients 4 --json >/dev/null
	case $place in
	spread) targets="$a0 $a1 $a2" ;;
	tail) targets="$a2 $a2 $a2" ;;
	head) targets="$a0 $a0 $a0" ;;
	esac
	rm -f "$WORK"/read*.json "$WORK"/write.json
	c0=$(cpu)
	i=0
	for a in $targets; do
		"$BIN" bench --addr "$a" --progress=false --duration "$DUR" --records 1000 --workload c \
			--consistency linearizable --clients "$CLIENTS" --seed $((i + 1)) --json >"$WORK/read$i.json" &
		i=$((i + 1))
	done
	if [ "$writers" -gt 0 ]; then
		"$BIN" bench --addr "$a0" --progress=false --duration "$DUR" --records 1000 --workload w \
			--durability sync --clients "$writers" --seed 9 --json >"$WORK/write.json" &
	fi
	wait $(jobs -p)
	c1=$(cpu)
	python3 - "$name" "$((c1 - c0))" "$(getconf CLK_TCK)" "$(cut -d' ' -f1 /proc/loadavg)" "$WORK" <<'PY' | tee -a "$WORK/results"
import glob, json, os, sys
name, ticks, hz, load, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
reads = writes = total = 0
p50s = []
for path in sorted(glob.glob(os.path.join(work, "read*.json"))) + glob.glob(os.path.join(work, "write.json")):
    r = json.load(open(path))["run"]
    if r["errors"]:
        sys.exit(f"{name}: {r['errors']} errors: {r.get('first_errors')}")
    total += r["ops"]
    for o in r["per_op"]:
        if o["op"].upper() == "READ":
            reads += o["ops_per_sec"]
            p50s.append(o["p50_us"])
        else:
            writes += o["ops_per_sec"]
cpu_us = ticks / hz * 1e6 / total if total else 0
p50 = sum(p50s) / len(p50s) if p50s else 0
print(f"{name}\t{reads:.0f}\t{writes:.0f}\t{cpu_us:.1f}\t{p50:.0f}\tload {load}")
PY
	stop
}

: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
	echo "== round $round"
	for w in 0 4; do
		run "writers $w, reads spread over n1 n2 n3" "$NEW" spread "$w"
		run "writers $w, reads all at the tail" "$NEW" tail "$w"
		run "writers $w, reads all at the head" "$NEW" head "$w"
		if [ -n "$OLD" ]; then
			run "writers $w, reads spread, before (each read at the head)" "$OLD" spread "$w"
		fi
	done
done
echo "== medians over $ROUNDS rounds (reads/s, writes/s, server CPU µs/op, read p50 µs)"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, reads, writes, cpu, p50, _ = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((float(reads), float(writes), float(cpu), float(p50)))
for name, rs in rows.items():
    m = [statistics.median(r[i] for r in rs) for i in range(4)]
    print(f"{name}: reads {m[0]:,.0f}/s, writes {m[1]:,.0f}/s, server CPU {m[2]:.1f} µs/op, read p50 {m[3]:,.0f} µs")
PY
