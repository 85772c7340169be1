#!/usr/bin/env bash
# Chain replication against VR on the same host, the same disk and the same
# durability (sync), with kefir bench (YCSB) over RESP (docs/design/chain.md,
# "Figures on the host"):
#   A4:   put latency of one client (workload w, closed loop) on a chain of
#         R=1 and R=3 (the thesis: ~3x), and on a 3-replica VR group;
#   YCSB: workload a (50 % read, 50 % update) with 16 clients on a 3-member
#         chain and a 3-replica VR group.
# Rounds alternate the configurations, because the machine is shared.
#
# Usage: bench/chain-vs-vr.sh [-p BASE_PORT] [-d DURATION] [-r ROUNDS] [-b KEFIR_BINARY]
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
set -euo pipefail

BASE=42500
DUR=10s
ROUNDS=1
# shellcheck source=bench/chain-lib.sh
. "$(dirname "$0")/chain-lib.sh"

# bench NAME ENGINE R ARGS...: one kefir bench run, its summary lines.
bench() {
	local name=$1 engine=$2 r=$3
	shift 3
	local addrs
	addrs=$(start "$engine" "$r")
	"$BIN" bench --addr "$addrs" --progress=false --duration "$DUR" --durability sync "$@" |
		awk -v n="$name" -v l="$(cut -d' ' -f1 /proc/loadavg)" '/ops\/s|UPDATE|READ/ {print n " (load " l "): " $0}'
	stop
}

for round in $(seq 1 "$ROUNDS"); do
	echo "== round $round"
	bench "A4 chain R=1, 1 client, w" chain 1 --load --records 1000 --workload w --clients 1
	bench "A4 chain R=3, 1 client, w" chain 3 --load --records 1000 --workload w --clients 1
	bench "A4 vr    R=3, 1 client, w" vr 3 --load --records 1000 --workload w --clients 1
	bench "YCSB-A chain R=3, 16 clients" chain 3 --load --records 10000 --workload a --clients 16
	bench "YCSB-A vr    R=3, 16 clients" vr 3 --load --records 10000 --workload a --clients 16
done
