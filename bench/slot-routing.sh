#!/usr/bin/env bash
# The Go client's slot routing (issue 28: "the Go client is slot-aware"; docs/design/cluster.md,
# "The Go client"): YCSB A and C with `kefir bench` against 3 `kefir server` nodes hosting three
# 3-replica groups (kefir up --groups 3's layout: each node leads one group), the client routing
# each call by its key's slot to its group's leader (--cluster on) vs today's forwarding (--cluster
# off: every call to node 1, which forwards the other groups' two thirds), side by side, the two
# alternating within each round on the same loaded cluster. Then the same against a single
# 3-replica group (no --groups): the cluster path (--cluster on: CLUSTER SLOTS, one group owning
# every slot) vs the single-group path (off) — the issue's "routing costs nothing measurable".
# Per run: throughput, p50 and p99 of reads and updates, the client's CPU per op (kefir bench's
# process_cpu_us_per_op) and the three servers' (user+system from /proc, over the run).
#
# Usage: bench/slot-routing.sh [-r ROUNDS] [-t 10s] [-c 16] [-n 100000] [-p 31600] [-s single|groups|both] [-w "a c"]
# Ports: clients PORT+1..3, peers PORT+11..13, HTTP PORT+21..23.
set -euo pipefail
ROUNDS=2; DURATION=10s; CLIENTS=16; RECORDS=100000; PORT=31600; SETUPS=both; WORKLOADS="a c"
while getopts "r:t:c:n:p:s:w:" o; do
	case $o in
	r) ROUNDS=$OPTARG ;;
	t) DURATION=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	n) RECORDS=$OPTARG ;;
	p) PORT=$OPTARG ;;
	s) SETUPS=$OPTARG ;;
	w) WORKLOADS=$OPTARG ;;
	*) sed -n '2,14p' "$0" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/kefir-slotrouting.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
go build -o "$WORK/kefir" ./cmd/kefir

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

up() { # GROUPS ("" for a single group)
	local groups=$1 members="" secret i
	rm -rf "$WORK/k"; mkdir -p "$WORK/k"; PIDS=()
	for i in 1 2 3; do members+="${members:+,}$i@127.0.0.1:$((PORT + 10 + i))/127.0.0.1:$((PORT + i))"; done
	secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	for i in 1 2 3; do
		KEFIR_CLUSTER_SECRET=$secret "$WORK/kefir" server --node-id "n$i" --dir "$WORK/k/n$i" \
			--client-addr "127.0.0.1:$((PORT + i))" --peer-addr "127.0.0.1:$((PORT + 10 + i))" \
			--http-addr "127.0.0.1:$((PORT + 20 + i))" --members "$members" --replica-id "$i" --cluster-id 4242 \
			${groups:+--groups "$groups"} --bootstrap=true --view-change-timeout 2s \
			--compact-interval=-1s --checkpoint-interval=-1s --log-level warn >"$WORK/k/n$i.log" 2>&1 &
		PIDS+=($!)
	done
	for i in 1 2 3; do
		for _ in $(seq 600); do listening $((PORT + i)) && break; sleep 0.1; done
	done
	for _ in $(seq 300); do
		redis-cli -p $((PORT + 1)) cluster info 2>/dev/null | grep -q 'cluster_state:ok' && return 0
		sleep 0.1
	done
	echo "cluster not ok; see $WORK/k" >&2; return 1
}

down() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	PIDS=()
}

cpu() { # user+system clock ticks of the servers
	local t=0 p
	for p in "${PIDS[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
	echo "$t"
}

bench() { # LABEL WORKLOAD CLUSTER
	local label=$1 w=$2 mode=$3 c0 c1 out=$WORK/run.json
	c0=$(cpu)
	"$WORK/kefir" bench --addr "127.0.0.1:$((PORT + 1))" --workload "$w" --records "$RECORDS" --clients "$CLIENTS" \
		--duration "$DURATION" --cluster "$mode" --progress=false --json >"$out" 2>"$WORK/bench.log"
	c1=$(cpu)
	python3 - "$out" "$label" "$w" "$mode" "$((c1 - c0))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["run"]
label, w, mode, ticks, hz = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
p50 = {o["op"]: o["p50_us"] for o in r["per_op"]}
p99 = {o["op"]: o["p99_us"] for o in r["per_op"]}
srv = ticks / hz * 1e6 / max(r["ops"], 1)
print(f"{label:7} {w}  cluster={mode:3}  {r['ops_per_sec']:8.0f} ops/s  errors {r['errors']}  "
      f"p50 read {p50.get('READ', 0):6.0f} µs  update {p50.get('UPDATE', 0):6.0f} µs  "
      f"p99 read {p99.get('READ', 0):6.0f} µs  update {p99.get('UPDATE', 0):6.0f} µs  "
      f"client CPU {r.get('process_cpu_us_per_op', 0):5.1f} µs/op  servers' CPU {srv:5.1f} µs/op")
EOF
}

run_setup() { # LABEL GROUPS
	local label=$1 groups=$2
	up "$groups"
	"$WORK/kefir" bench --addr "127.0.0.1:$((PORT + 1))" --workload a --records "$RECORDS" --clients "$CLIENTS" \
		--load --duration 1s --progress=false >/dev/null 2>&1
	for r in $(seq "$ROUNDS"); do
		echo "== $label, round $r ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
		for w in $WORKLOADS; do
			if [ $((r % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
			for m in $order; do bench "$label" "$w" "$m"; done
		done
	done
	down
}

case $SETUPS in
groups | both) run_setup groups '1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383' ;;
esac
case $SETUPS in
single | both) run_setup single "" ;;
esac
