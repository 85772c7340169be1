#!/usr/bin/env bash
# Issue 5's side-by-side benchmark: a 3-replica Kefir group (`kefir up`, durability sync)
# vs a 3-member etcd cluster (Debian etcd-server; fsyncs its WAL before acknowledging),
# both on loopback, driven by the same YCSB harness with the same clients and sizes:
#   writes: workload W (100% updates), 128-byte values, 1 and 64 closed-loop clients;
#   reads:  workload C (100% reads), linearizable (Kefir) vs linearizable (etcd default), 64 clients.
# Systems alternate, -r rounds each; the report prints every run, each with its cost per
# operation (issue 31: server CPU µs/op of all three members, write_bytes per write, Kefir's
# fsyncs per write; bench/README.md "Cost per operation"). Results: bench/results/vr-vs-etcd.md.
#
# Usage: bench/vr-vs-etcd.sh [-d 5s] [-r 1]
set -euo pipefail
DUR=5s
ROUNDS=1
while getopts "d:r:" o; do
	case $o in
	d) DUR=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	*) echo "usage: $0 [-d duration] [-r rounds]" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/kefir-vr-etcd.XXXXXX)
UPPID=""
cleanup() {
	[ -n "$UPPID" ] && kill "$UPPID" 2>/dev/null && wait "$UPPID" 2>/dev/null || true
	bash "$ROOT/bench/peers/etcd.sh" stop "$WORK/etcd" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

go build -o "$WORK/kefir" ./cmd/kefir
"$WORK/kefir" up --dir "$WORK/data" --base-port 16380 --log-level warn >"$WORK/up.log" 2>&1 &
UPPID=$!
for _ in $(seq 100); do grep -q "Kefir is up" "$WORK/up.log" && break; sleep 0.2; done
grep -q "Kefir is up" "$WORK/up.log" || { cat "$WORK/up.log"; echo "kefir up did not start" >&2; exit 1; }
ETCD=$(bash bench/peers/etcd.sh start "$WORK/etcd" | tail -1)
KEFIR=127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382
# Cost per operation: every member's pid (kefir up prints them, etcd.sh writes them) and
# Kefir's /metrics (its fsync count).
grep 'admin http' "$WORK/up.log" | grep -o 'pid [0-9]*' | awk '{print $2}' >"$WORK/kefir.pids"
cat "$WORK"/etcd/etcd-*.pid >"$WORK/etcd.pids"
KMETRICS=$(grep -o 'admin http://[^ ]*' "$WORK/up.log" | sed 's#^admin ##; s#/*$#/metrics#' | paste -sd, -)
kcost=(-server-pids "$WORK/kefir.pids" -metrics "$KMETRICS")
ecost=(-server-pids "$WORK/etcd.pids")

cd bench
go build -o "$WORK/ycsb" ./ycsb
common=(-records 20000 -valuesize 128 -warmup 1s -d "$DUR" -load-clients 16)
out="$ROOT/bench/results/vr-vs-etcd.md"
{
	echo "# Kefir (3 replicas, VR, sync) vs etcd (3 members) — issue 5"
	echo
	echo "Command: \`bash bench/vr-vs-etcd.sh -d $DUR -r $ROUNDS\`; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); Kefir at $(git -C "$ROOT" rev-parse --short HEAD)."
	echo
	for r in $(seq "$ROUNDS"); do
		echo "## Round $r"
		echo
		echo "### Writes (workload W, 128-byte values)"
		"$WORK/ycsb" -db kefir -addr "$KEFIR" -durability sync -workloads w -clients 1,64 -label kefir-vr-sync "${common[@]}" "${kcost[@]}"
		"$WORK/ycsb" -db etcd -addr "$ETCD" -workloads w -clients 1,64 -label etcd "${common[@]}" "${ecost[@]}"
		echo
		echo "### Linearizable reads (workload C)"
		"$WORK/ycsb" -db kefir -addr "$KEFIR" -consistency linearizable -workloads c -clients 64 -label kefir-vr-linearizable "${common[@]}" "${kcost[@]}"
		"$WORK/ycsb" -db etcd -addr "$ETCD" -workloads c -clients 64 -label etcd-linearizable "${common[@]}" "${ecost[@]}"
		echo
	done
	echo "Kefir fsyncs: $(curl -s http://127.0.0.1:18380/metrics | grep -E '^kefir_vr_log_fsyncs_total' || true)"
} 2>/dev/null | tee "$out"
