#!/usr/bin/env bash
# Strong reads under AUSI at the durable point (docs/design/chain.md,
# "Strong reads at the durable point"): a chain of three log members
# (D-D-D, AUSI, a standalone master), YCSB workload a (50 % linearizable
# reads spread over the members with --chain-reads, 50 % `cad` updates,
# answered at commit before any fsync) on RECORDS records (10: a read's key
# often has an update not yet on every disk); with -o OLD_BINARY the same
# on another build, rounds alternating the two (the machine is shared).
# Each run prints ops/s, the reads' count, p50 and p99 (µs), the updates'
# p50, and the members' kefir_chain_reads_durable_waits_total (0 on a build
# before the rule).
#
# Usage: bench/chain-ausi-reads.sh [-p BASE_PORT] [-d DURATION] [-r ROUNDS] [-b KEFIR_BINARY] [-o OLD_BINARY] [-c CLIENTS] [-n RECORDS]
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
set -euo pipefail

BASE=42800
DUR=5s
ROUNDS=2
OLD=
CLIENTS=1
RECORDS=10
args=()
while [ $# -gt 0 ]; do
	case $1 in
	-o) OLD=$2; shift 2 ;;
	-c) CLIENTS=$2; shift 2 ;;
	-n) RECORDS=$2; shift 2 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
# shellcheck source=bench/chain-lib.sh
. "$(dirname "$0")/chain-lib.sh"
NEW=$BIN

for round in $(seq 1 "$ROUNDS"); do
	echo "== round $round"
	for v in new ${OLD:+old}; do
		BIN=$NEW
		[ "$v" = old ] && BIN=$OLD
		addrs=$(start chain 3 ausi)
		"$BIN" bench --addr "$addrs" --progress=false --duration "$DUR" --durability cad --consistency linearizable \
			--chain-reads --load --records "$RECORDS" --workload a --clients "$CLIENTS" --json >"$WORK/run.json"
		waits=0
		for i in 1 2 3; do
			w=$(curl -s "127.0.0.1:$((BASE + 19 + i))/metrics" | awk '/^kefir_chain_reads_durable_waits_total/ {s += $2} END {print s + 0}')
			waits=$((waits + w))
		done
		python3 - "$v" "$WORK/run.json" "$waits" <<'PY'
import json, sys
v, path, waits = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(path))["run"]
rd = next(o for o in r["per_op"] if o["op"].upper() == "READ")
up = next(o for o in r["per_op"] if o["op"].upper() == "UPDATE")
if r["errors"]:
    sys.exit(f"{v}: {r['errors']} errors: {r.get('first_errors')}")
print(f"{v}\tops/s {r['ops_per_sec']:.0f}\treads {rd['count']}\tread p50 {rd['p50_us']:.0f}\tp99 {rd['p99_us']:.0f}\tupdate p50 {up['p50_us']:.0f}\tdurable waits {waits}")
PY
		stop
	done
done
