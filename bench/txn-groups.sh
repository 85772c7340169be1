#!/usr/bin/env bash
# The Go client's transactions in a cluster (issues 28, 29; docs/design/cluster.md §10): c.Txn
# transfers between two keys of one hash tag (single-group transactions: the one-op commit), the
# tags' slots spread over the three groups of 3 `kefir server` nodes (kefir up --groups 3's layout:
# each node leads one group), the client dialed to node 1 alone. Two builds of `txbench xgroup -rows
# "any group"` alternate within each round on the same cluster: BASE's client (a git revision: its
# client/ package, everything else this tree's) and this tree's. Per run: commits/s, attempts per
# commit, p50/p99, and the three servers' CPU per commit (user+system from /proc).
#
# Usage: bench/txn-groups.sh [-b BASE] [-r ROUNDS] [-t 5s] [-c 16] [-p 31500]
# Ports: clients PORT+1..3, peers PORT+11..13, HTTP PORT+21..23.
set -euo pipefail
BASE=3c6650a; ROUNDS=3; DURATION=5s; CLIENTS=16; PORT=31500
while getopts "b:r:t:c:p:" o; do
	case $o in
	b) BASE=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	t) DURATION=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	p) PORT=$OPTARG ;;
	*) sed -n '2,11p' "$0" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/kefir-txngroups.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
go build -o "$WORK/kefir" ./cmd/kefir
(cd bench && go build -o "$WORK/txbench-new" ./txbench)
# BASE's client in a copy of this tree.
mkdir -p "$WORK/base"
git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$WORK/base"
rm -rf "$WORK/base/client"
git archive "$BASE" client | tar -xf - -C "$WORK/base"
(cd "$WORK/base/bench" && go build -o "$WORK/txbench-base" ./txbench)

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

members=""
for i in 1 2 3; do members+="${members:+,}$i@127.0.0.1:$((PORT + 10 + i))/127.0.0.1:$((PORT + i))"; done
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
for i in 1 2 3; do
	KEFIR_CLUSTER_SECRET=$secret "$WORK/kefir" server --node-id "n$i" --dir "$WORK/k/n$i" \
		--client-addr "127.0.0.1:$((PORT + i))" --peer-addr "127.0.0.1:$((PORT + 10 + i))" \
		--http-addr "127.0.0.1:$((PORT + 20 + i))" --members "$members" --replica-id "$i" --cluster-id 4243 \
		--groups '1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383' --bootstrap=true --view-change-timeout 2s \
		--compact-interval=-1s --checkpoint-interval=-1s --log-level warn >"$WORK/n$i.log" 2>&1 &
	PIDS+=($!)
done
for i in 1 2 3; do
	for _ in $(seq 600); do listening $((PORT + i)) && break; sleep 0.1; done
done
ok=0
for _ in $(seq 300); do
	if redis-cli -p $((PORT + 1)) cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then ok=1; break; fi
	sleep 0.1
done
[ $ok = 1 ] || { echo "cluster not ok" >&2; cat "$WORK"/n*.log >&2; exit 1; }
pids=$(IFS=,; echo "${PIDS[*]}")
echo "txn-groups: base $BASE ($(git log -1 --format=%h "$BASE")) vs $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- client || echo +dirty); $CLIENTS goroutines, $DURATION a run"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
	for b in $order; do
		echo "== round $r, $b ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
		"$WORK/txbench-$b" xgroup -kefir "127.0.0.1:$((PORT + 1))" -rows "any group" -r 1 -d "$DURATION" \
			-c "$CLIENTS" -accts 64 -pid "$pids" 2>"$WORK/err-$b.log" | tail -1
		if [ -s "$WORK/err-$b.log" ]; then echo "   errors: $(wc -l <"$WORK/err-$b.log") ($(head -1 "$WORK/err-$b.log"))"; fi
	done
done
