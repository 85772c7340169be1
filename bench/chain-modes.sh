#!/usr/bin/env bash
# The chain's update modes side by side (docs/design/chain.md, "Update modes
# on the host"): a chain of three log members (D-D-D, a standalone master)
# in SU, AUSI and AU, with kefir bench (YCSB workload w: updates only) over
# RESP on loopback:
#   put latency of one client (closed loop), and
#   throughput of 16 clients,
# each mode at its level: SU `sync` writes (answered at commit, every log
# member's fsync in series), AUSI `async` writes (answered at commit, no disk
# waited for), AU `async` writes (answered by the head alone) — and AUSI and
# AU at `sync`, which they answer once every log member fsynced the write
# (side by side; session 30, "Per-request durability"). Rounds alternate the
# configurations (the machine is shared); the summary gives each figure's
# median over the rounds.
#
# Usage: bench/chain-modes.sh [-p BASE_PORT] [-d DURATION] [-r ROUNDS] [-b KEFIR_BINARY]
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
set -euo pipefail

BASE=42600
DUR=5s
ROUNDS=3
# shellcheck source=bench/chain-lib.sh
. "$(dirname "$0")/chain-lib.sh"

# bench NAME MODE DURABILITY CLIENTS: one kefir bench run; its JSON's
# throughput and update p50 go to $WORK/results as "NAME<TAB>ops/s<TAB>p50".
bench() {
	local name=$1 mode=$2 dur=$3 clients=$4 addrs
	addrs=$(start chain 3 "$mode")
	"$BIN" bench --addr "$addrs" --progress=false --duration "$DUR" --durability "$dur" \
		--load --records 1000 --workload w --clients "$clients" --json >"$WORK/run.json"
	python3 - "$name" "$WORK/run.json" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY' | tee -a "$WORK/results"
import json, sys
name, path, load = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(path))["run"]
up = next(o for o in r["per_op"] if o["op"].upper() == "UPDATE")
if r["errors"]:
    sys.exit(f"{name}: {r['errors']} errors: {r.get('first_errors')}")
print(f"{name}\t{r['ops_per_sec']:.0f}\t{up['p50_us']:.0f}\tload {load}")
PY
	stop
}

: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
	echo "== round $round"
	for c in 1 16; do
		bench "SU sync, $c client(s)" su sync "$c"
		bench "AUSI sync, $c client(s)" ausi sync "$c"
		bench "AUSI async, $c client(s)" ausi async "$c"
		bench "AU async, $c client(s)" au async "$c"
		bench "AU sync, $c client(s)" au sync "$c"
	done
done
echo "== medians over $ROUNDS rounds (ops/s, update p50 µs)"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, ops, p50, _ = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((float(ops), float(p50)))
for name, rs in rows.items():
    print(f"{name}: {statistics.median(r[0] for r in rs):,.0f} ops/s, update p50 {statistics.median(r[1] for r in rs):,.0f} µs")
PY
