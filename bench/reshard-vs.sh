#!/usr/bin/env bash
# Issue 28's move benchmark, side by side in one run: a live move of a third of the slots
# (5461: 0-5460, from the first master/group to the second) under load, on
#   - Redis Cluster: 3 masters (Debian redis-server 7, no replicas), `redis-cli --cluster reshard
#     --cluster-from ID1 --cluster-to ID2 --cluster-slots 5461 --cluster-yes`;
#   - Kefir: 3 `kefir server` nodes hosting 3 groups of 3 replicas (`--groups`, as `kefir up
#     --groups 3`), `kefir cluster move-slots --from 1 --to 2 --slots 0-5460`.
# Both get the same client (bench/reshardvs: go-redis ClusterClient, closed loop, GET/SET of
# the loaded keys, uniform), the same keys and values. Per cell (durability × keys × value
# size) each system runs on a fresh cluster, the other's stopped; the order alternates cell
# by cell. Rows: durable = Redis appendonly yes + appendfsync always against Kefir sync (a
# write acknowledged once on disk at a majority of 3: more work than one Redis master's fsync);
# memory = Redis without persistence against Kefir async.
#
# Usage: bench/reshard-vs.sh [-m durable|memory|both] [-k 50000,200000] [-s 64,1024] [-c 16]
#        [-S 10s] [-A 3s] [-p 34500] [-y redis,kefir] [-x "kefir move-slots flags[;flags...]"] [-j OUT.jsonl] [-P DIR]
# -y: the systems, in the first cell's order (then rotated cell by cell); -x: extra flags of
# kefir cluster move-slots, one Kefir run per ';'-separated variant (e.g. "-x ';--page-pause 0;--page-pause 50ms'":
# the empty variant is move-slots' default, paced by its latency probe; --page-pause 0 is unpaced);
# -P DIR: CPU profiles (pprof, 6 s from the move's start) of nodes 1 and 2 (the source's and the
# destination's leaders) into DIR, one pair per Kefir run.
# Ports: Redis PORT+1..3 (cluster bus +10000), Kefir clients PORT+101..103, peers +201..,
# HTTP +301.. (the bench's range on the shared box: 34500-34999 and buses 44500-44999).
set -euo pipefail
MODES=durable; KEYS=50000,200000; SIZES=64,1024; CLIENTS=16; STEADY=10s; AFTER=3s; PORT=34500
SYSTEMS=redis,kefir; XMOVE=""; JSON=""; PROF=""
while getopts "m:k:s:c:S:A:p:y:x:j:P:" o; do
	case $o in
	m) MODES=$OPTARG ;;
	k) KEYS=$OPTARG ;;
	s) SIZES=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	S) STEADY=$OPTARG ;;
	A) AFTER=$OPTARG ;;
	p) PORT=$OPTARG ;;
	y) SYSTEMS=$OPTARG ;;
	x) XMOVE=$OPTARG ;;
	j) JSON=$OPTARG ;;
	P) PROF=$OPTARG; mkdir -p "$PROF" ;;
	*) sed -n '2,23p' "$0" >&2; exit 2 ;;
	esac
done
[ "$MODES" = both ] && MODES=durable,memory
cd "$(dirname "$0")/.."
ROOT=$PWD
source bench/peers/lib.sh
WORK=$(mktemp -d /tmp/kefir-reshard-vs.XXXXXX)
JSON=${JSON:-$WORK/summary.jsonl}
cleanup() {
	stop_pids "$WORK" '*.pid' >/dev/null 2>&1 || true
	rm -rf "$WORK/r" "$WORK/k"
}
trap cleanup EXIT

go build -o "$WORK/kefir" ./cmd/kefir
(cd bench && go build -o "$WORK/reshardvs" ./reshardvs)

# A node preallocates its logs at the first start: on a shared disk that can take a while.
wait_port() { for _ in $(seq 1200); do listening "$1" && return 0; sleep 0.1; done; echo "port $1 never listened" >&2; return 1; }

# redis_up MODE: three cluster-enabled masters, slots split by --cluster create (0-5460, …).
redis_up() {
	rm -rf "$WORK/r"; mkdir -p "$WORK/r"
	local persist=(--appendonly no --save '')
	[ "$1" = durable ] && persist=(--appendonly yes --appendfsync always --save '')
	local addrs=()
	for i in 1 2 3; do
		local p=$((PORT + i)); mkdir -p "$WORK/r/$p"
		redis-server --port "$p" --bind 127.0.0.1 --dir "$WORK/r/$p" --cluster-enabled yes \
			--cluster-config-file nodes.conf --cluster-node-timeout 5000 "${persist[@]}" \
			--daemonize no --logfile "$WORK/r/$p.log" &
		echo $! >"$WORK/redis-$i.pid"
		addrs+=("127.0.0.1:$p")
	done
	for i in 1 2 3; do wait_port $((PORT + i)); done
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$WORK/r/create.log" 2>&1
	for _ in $(seq 100); do
		ok=0
		for i in 1 2 3; do redis-cli -p $((PORT + i)) cluster info | grep -q 'cluster_state:ok' && ok=$((ok + 1)); done
		[ $ok = 3 ] && return 0
		sleep 0.2
	done
	echo "redis cluster not ok; see $WORK/r" >&2; return 1
}

# kefir_up MODE: three nodes, three groups (kefir up --groups 3's layout; bench/peers/lib.sh).
kefir_up() {
	local dur=sync; [ "$1" = memory ] && dur=async
	kefir_groups_up "$WORK" "$PORT" "$dur" '1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383'
}

cell() { # SYSTEM MODE KEYS SIZE [KEFIR MOVE FLAGS]
	local sys=$1 mode=$2 keys=$3 size=$4 xmove=${5:-} addrs pids move
	if [ "$sys" = redis ]; then
		# The range's ports are also in the kernel's ephemeral range: one may be taken for a
		# moment by someone's outgoing connection. Try twice.
		redis_up "$mode" || { tail -n 3 "$WORK"/r/*.log; stop_pids "$WORK" 'redis-*.pid'; redis_up "$mode"; } ||
			{ echo "$sys: did not start"; tail -n 3 "$WORK"/r/*.log; stop_pids "$WORK" 'redis-*.pid'; return 0; }
		addrs=127.0.0.1:$((PORT + 1)),127.0.0.1:$((PORT + 2)),127.0.0.1:$((PORT + 3))
		pids=$(cat "$WORK"/redis-*.pid | paste -sd,)
		local from to
		from=$(redis-cli -p $((PORT + 1)) cluster myid); to=$(redis-cli -p $((PORT + 2)) cluster myid)
		move="redis-cli --cluster reshard 127.0.0.1:$((PORT + 1)) --cluster-from $from --cluster-to $to --cluster-slots 5461 --cluster-yes >$WORK/r/reshard.log 2>&1; rc=\$?; tail -3 $WORK/r/reshard.log; exit \$rc"
		sys="redis($([ "$mode" = durable ] && echo appendfsync-always || echo no-persistence))"
	else
		kefir_up "$mode" || { tail -n 3 "$WORK"/k/n*.log; stop_pids "$WORK" 'kefir-*.pid'; kefir_up "$mode"; } ||
			{ echo "$sys: did not start"; tail -n 3 "$WORK"/k/n*.log; stop_pids "$WORK" 'kefir-*.pid'; return 0; }
		addrs=127.0.0.1:$((PORT + 101)),127.0.0.1:$((PORT + 102)),127.0.0.1:$((PORT + 103))
		pids=$(cat "$WORK"/kefir-*.pid | paste -sd,)
		move="$WORK/kefir cluster move-slots --addr $addrs --from 1 --to 2 --slots 0-5460 --json $xmove"
		if [ -n "$PROF" ]; then
			local tag; tag="$mode-$keys-$size${xmove:+-${xmove//[^a-z0-9]/}}"
			move="for n in 1 2; do curl -s -o $PROF/n\$n-$tag.pb 'http://127.0.0.1:'\$(($PORT + 300 + n))'/debug/pprof/profile?seconds=6' >/dev/null 2>&1 & done; $move"
		fi
		sys="kefir($([ "$mode" = durable ] && echo sync || echo async)${xmove:+ $xmove})"
	fi
	"$WORK/reshardvs" -system "$sys" -addrs "$addrs" -pids "$pids" -keys "$keys" -size "$size" -c "$CLIENTS" \
		-steady "$STEADY" -after "$AFTER" -move "$move" -json "$JSON" || echo "$sys: FAILED" >&2
	stop_pids "$WORK" 'redis-*.pid'; stop_pids "$WORK" 'kefir-*.pid'
	echo "$sys data: $(du -sh "$WORK/r" "$WORK/k" 2>/dev/null | awk '{print $1}' | paste -sd' ')"
	rm -rf "$WORK/r" "$WORK/k"
}

echo "Command: \`bash bench/reshard-vs.sh -m $MODES -k $KEYS -s $SIZES -c $CLIENTS -S $STEADY -A $AFTER -y $SYSTEMS${XMOVE:+ -x \"$XMOVE\"}\`;" \
	"$(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); Kefir at $(git rev-parse --short HEAD);" \
	"$(redis-server --version | grep -o 'v=[0-9.]*')"
# The runs of a cell: redis, and kefir once per -x variant.
order=()
IFS=',' read -ra syss <<<"$SYSTEMS"
# Split -x at ';', keeping empty variants (unpaced) wherever they are: read -a drops a trailing one.
variants=(); rest="$XMOVE;"
while [ -n "$rest" ]; do variants+=("${rest%%;*}"); rest=${rest#*;}; done
for sys in "${syss[@]}"; do
	if [ "$sys" = kefir ]; then for v in "${variants[@]}"; do order+=("kefir|$v"); done; else order+=("$sys|"); fi
done
for mode in ${MODES//,/ }; do
	for keys in ${KEYS//,/ }; do
		for size in ${SIZES//,/ }; do
			for run in "${order[@]}"; do
				echo; echo "=== ${run%%|*} ${run#*|} $mode keys=$keys size=$size ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
				cell "${run%%|*}" "$mode" "$keys" "$size" "${run#*|}"
			done
			order=("${order[@]:1}" "${order[0]}") # rotate: who goes first alternates
		done
	done
done
echo
echo "Summary (one JSON line per cell): $JSON"
cat "$JSON"
