#!/usr/bin/env bash
# Issue 29's transaction benchmark, side by side in one run: a read-modify-write transaction
# (read 2 keys of a hot set of H, write both; H = 2, 8, 64, 1024), 16 closed-loop clients,
# aborts retried with backoff, on
#   - a 3-replica Kefir group at sync durability: KEFIR.TX via the Go client's c.Txn
#     (SERIALIZABLE) and WATCH/MULTI/EXEC via go-redis at the leader;
#   - a 3-member etcd cluster (Debian etcd; fsyncs its WAL before acknowledging): a read Txn,
#     then Txn(compare mod_revision, put, put);
#   - one redis-server with appendfsync always (no replicas): WATCH/MULTI/EXEC.
# Cells alternate system by system within a round; the table is the median over the rounds,
# with server CPU µs per committed transaction (all of a system's processes, /proc) and
# fsyncs per commit (Kefir's and etcd's /metrics). Then the read-only row: a c.Txn of 4 Gets
# against 4 c.Gets. Method: docs/design/transactions.md, "Benchmarks"; driver: bench/txbench/vs.go.
#
# Usage: bench/txn-vs.sh [-d 5s] [-r 3] [-c 16] [-H 2,8,64,1024] [-p 28500]
# Ports: Kefir PORT.. (+50 HTTP, +100 peers), etcd PORT+200.., redis PORT+300.
set -euo pipefail
DUR=5s; ROUNDS=3; CLIENTS=16; HOT=2,8,64,1024; PORT=28500
while getopts "d:r:c:H:p:" o; do
	case $o in
	d) DUR=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	H) HOT=$OPTARG ;;
	p) PORT=$OPTARG ;;
	*) sed -n '2,16p' "$0" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/kefir-txn-vs.XXXXXX)
cleanup() {
	bash "$ROOT/bench/peers/kefir.sh" stop "$WORK/kefir" >/dev/null 2>&1 || true
	bash "$ROOT/bench/peers/etcd.sh" stop "$WORK/etcd" >/dev/null 2>&1 || true
	bash "$ROOT/bench/peers/redis.sh" stop "$WORK/redis" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

go build -o "$WORK/kefir.bin" ./cmd/kefir
(cd bench && go build -o "$WORK/txbench" ./txbench)
# A CPU-starved 2-core box needs a longer view-change timeout than the default, or the run
# measures elections; no background maintenance inside a measured cell (bench/peers/kefir.sh).
KEFIR=$(bash bench/peers/kefir.sh start "$WORK/kefir" --replicas 3 --port "$PORT" --bin "$WORK/kefir.bin" \
	--view-change-timeout 2s --no-maintenance | tail -1)
ETCD=$(bash bench/peers/etcd.sh start "$WORK/etcd" --members 3 --port $((PORT + 200)) --no-maintenance | tail -1)
REDIS=$(bash bench/peers/redis.sh start "$WORK/redis" --port $((PORT + 300)) --fsync always --no-maintenance | tail -1)

{
	echo "Command: \`bash bench/txn-vs.sh -d $DUR -r $ROUNDS -c $CLIENTS -H $HOT\`; $(date -u +%Y-%m-%dT%H:%MZ);" \
		"$(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); Kefir at $(git rev-parse --short HEAD);" \
		"$(redis-server --version | grep -o 'v=[0-9.]*'); etcd $("$(command -v etcd || echo /usr/bin/etcd)" --version | head -1 | awk '{print $3}')."
	echo
	"$WORK/txbench" vs -kefir "$KEFIR" -kefir-pids "$(cat "$WORK"/kefir/kefir-*.pid | paste -sd,)" \
		-kefir-metrics "$(cat "$WORK/kefir/metrics-urls")" \
		-etcd "$ETCD" -etcd-pids "$(cat "$WORK"/etcd/etcd-*.pid | paste -sd,)" \
		-redis "$REDIS" -redis-pid "$(cat "$WORK"/redis/redis-*.pid)" \
		-hot "$HOT" -c "$CLIENTS" -d "$DUR" -r "$ROUNDS"
}
