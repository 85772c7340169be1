#!/usr/bin/env bash
# kefir cluster rebalance under load (issue 28: "rebalancing by bytes and by load, rate-limited so
# foreground p99 stays within 2× of steady state"): 3 `kefir server` nodes hosting two 3-replica
# groups, skewed — group 1 owns slots 0-12287 (three quarters of the keys), group 2 12288-16383 —
# loaded with N uniform keys of S bytes; then bench/reshardvs (go-redis ClusterClient, closed loop,
# GET/SET half and half) measures a steady window and `kefir cluster rebalance --by bytes` under
# the same load (one move of about a quarter of the slots to group 2). Each variant runs on a fresh
# cluster, the variants alternating: the adaptive pace (the default) and each -x variant
# (default: --page-pause 0, unpaced).
#
# Usage: bench/rebalance.sh [-k 100000] [-s 64] [-c 16] [-S 10s] [-A 3s] [-r ROUNDS] [-d sync|async]
#        [-p 27000] [-x "rebalance flags[;flags...]"] [-j OUT.jsonl]
# Ports: clients PORT+101..103, peers PORT+201..203, HTTP PORT+301..303.
set -euo pipefail
KEYS=100000; SIZE=64; CLIENTS=16; STEADY=10s; AFTER=3s; ROUNDS=1; DUR=sync; PORT=27000
XREB="--page-pause 0"; JSON=""
while getopts "k:s:c:S:A:r:d:p:x:j:" o; do
	case $o in
	k) KEYS=$OPTARG ;;
	s) SIZE=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	S) STEADY=$OPTARG ;;
	A) AFTER=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	d) DUR=$OPTARG ;;
	p) PORT=$OPTARG ;;
	x) XREB=$OPTARG ;;
	j) JSON=$OPTARG ;;
	*) sed -n '2,14p' "$0" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
source bench/peers/lib.sh
WORK=$(mktemp -d /tmp/kefir-rebalance.XXXXXX)
JSON=${JSON:-$WORK/summary.jsonl}
cleanup() {
	stop_pids "$WORK" '*.pid' >/dev/null 2>&1 || true
	rm -rf "$WORK/k"
}
trap cleanup EXIT
go build -o "$WORK/kefir" ./cmd/kefir
(cd bench && go build -o "$WORK/reshardvs" ./reshardvs)

# Group 1 owns three quarters of the slots (bench/peers/lib.sh).
kefir_up() { kefir_groups_up "$WORK" "$PORT" "$DUR" '1=1,2,3:0-12287;2=2,3,1:12288-16383'; }

run() { # REBALANCE FLAGS
	local x=$1 addrs pids name
	kefir_up || { tail -n 3 "$WORK"/k/n*.log; stop_pids "$WORK" 'kefir-*.pid'; return 0; }
	addrs=127.0.0.1:$((PORT + 101)),127.0.0.1:$((PORT + 102)),127.0.0.1:$((PORT + 103))
	pids=$(cat "$WORK"/kefir-*.pid | paste -sd,)
	name="kefir rebalance ${x:-adaptive}"
	"$WORK/reshardvs" -system "$name" -addrs "$addrs" -pids "$pids" -keys "$KEYS" -size "$SIZE" -c "$CLIENTS" \
		-steady "$STEADY" -after "$AFTER" -moved-slots-end 4095 -json "$JSON" \
		-move "$WORK/kefir cluster rebalance --addr $addrs --by bytes --json $x 2>$WORK/rebalance.log; rc=\$?; grep -E 'steady probe|probe p99|moved .* keys pre-copied' $WORK/rebalance.log; exit \$rc" ||
		echo "$name: FAILED" >&2
	stop_pids "$WORK" 'kefir-*.pid'
	rm -rf "$WORK/k"
}

IFS=';' read -r -a variants <<<"$XREB"
for r in $(seq "$ROUNDS"); do
	echo "== round $r ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
	run ""
	for v in "${variants[@]}"; do run "$v"; done
done
echo "summary: $JSON"
