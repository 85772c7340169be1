#!/usr/bin/env bash
# The standard YCSB matrix on this machine (issue 8): every system is started once, on
# loopback, then one ycsb process (ycsb -matrix) measures short ROUNDS, interleaved at the
# cell level (each workload × client count runs on every system back to back), and each
# cell is reported as the median of its rounds — on a shared machine a burst of someone
# else's work then hits one round of every system instead of all of one system's figures. MATRICES=2 runs the whole matrix twice back to back (the
# systems stay up) and compares the two row by row (issue 8: within 15% on medians).
# Before round 1 of each matrix every system runs every workload once, unmeasured
# (PREWARM), so neither matrix is the only one to meet cold systems (ZooKeeper's JIT,
# page cache, heaps).
#
#   bench/compare.sh                                # the standard matrix, twice: ≈ 17 minutes
#   DIAGNOSTIC=1 bench/compare.sh                   # plus the diagnostic rows (below)
#   make compare                                    # the same, then docs/benchmarks.md is regenerated
#   REPORT_ONLY=1 bench/compare.sh                  # rebuild the reports from the last run's JSON
#   WORKLOADS=a ROUNDS=1 SYSTEMS="ceiling kefir-sync" bench/compare.sh   # a quick look
#
# Systems (SYSTEMS, default the standard set; DIAGNOSTIC=1 adds the diagnostic rows), each
# row's durability matched to the Kefir mode it is compared with, each driver with the
# connection model its users would use:
#   ceiling               trivial in-process RESP server via Kefir's client (POOL pipelined
#                         connections): the ceiling of the harness + the client the kefir rows use
#   ceiling-redis         the same server via go-redis (a pool of one connection per client): the
#                         ceiling of the harness + the client the redis rows use
#   ceiling-proc ceiling-proc-redis   (diagnostic) the same trivial server in its own process
#                         (ycsb -serve), as every real system is
#   redis-always          Redis, appendfsync always (fsync before reply)        ≈ kefir sync, 1 node
#   redis-none            Redis, no persistence                                 ≈ kefir async, 1 node
#   redis-wait            Redis primary + 2 replicas, everysec, WAIT 1 per write ≈ kefir cad, 3 replicas
#   kefir-sync kefir-async                   a single Kefir node
#   kefir3-sync kefir3-cad kefir3-async      a 3-replica VR group, linearizable reads at the leader
#   kefir3-follower       (diagnostic: an ablation) the group, sync writes, cross-client-monotonic
#                         reads (followers serve them with --follower-reads)
#   etcd                  3 members, linearizable reads, fsync per commit        ≈ kefir3-sync
#   zk-sync zk-nosync     ZooKeeper 3 servers, forceSync yes / no, local reads  ≈ kefir3-sync / -cad
#
# Quiet systems (NO_MAINTENANCE=1, the default): every system runs with its background
# maintenance off — Kefir's compaction and index checkpoint, Redis's AOF rewrite, etcd's
# and ZooKeeper's snapshots — because each fires on a timer or a count, burns 0.2-0.5 cores
# for a moment, and lands inside whichever system's cell is being measured then (the
# matrix is short: nothing needs compacting). QUIESCE (200ms) pauses before every cell.
# The CPU watch: each cell records the CPU used by processes outside the matrix (not the
# ycsb process, not any system's servers, read from /proc); a cell during which they used
# more than DISTURBED (0.25) cores is measured again, up to REMEASURE (2) times, at most
# REMEASURE_BUDGET (20) times per matrix, keeping the least disturbed measurement, and the
# report prints every cell's figure.
#
# Knobs: WORKLOADS (a,c,e,w), CLIENTS (64), RECORDS (10000), VALUESIZE (1000),
# D (2s measured per cell per round), W (500ms warm-up before each), ROUNDS (3), MATRICES (2),
# PREWARM (1s per system and workload before round 1), DELAY (0: one-way delay on every
# client and peer link, via bench/delaymesh), POOL (1: connections of Kefir's client, which
# pipelines; go-redis always gets one connection per client, ZooKeeper one session, etcd one
# clientv3), GOGC (400, for the ycsb process only: fewer collections of the harness's own heap
# inside the measured windows; every system is driven by the same process), DIAGNOSTIC (0),
# NO_MAINTENANCE (1), QUIESCE (200ms), DISTURBED (0.25), REMEASURE (2), REMEASURE_BUDGET (20),
# OUT (results/compare), PORT_* (each system's ports, below).
#
# Cost per operation (issue 31): every cell also records, per system, the CPU µs of all its
# server processes per operation (/proc/PID/stat), bytes written per write (/proc/PID/io
# write_bytes), fsyncs per write (Kefir's /metrics; /proc has no fsync count for the
# others) and the client side's network bytes per operation (the ycsb process's socket
# I/O); the summaries add a cost table that marks the CPU-bound rows, and the ratios table
# adds Kefir ÷ peer on each cost (bench/ycsb/cost.go).
# Writes OUT/rounds/*.json (every round), OUT/summary-N.json, OUT/compare.md (every table,
# commands, load averages), OUT/plots/*.png, and OUT/docs-section.md (the claims: Kefir ÷ peer
# ratios, matrix 1's totals, the agreement verdict, the plots);
# with DOCS=path, splices OUT/docs-section.md into that file between
# <!-- BEGIN ycsb-compare --> and <!-- END ycsb-compare -->.
set -euo pipefail
cd "$(dirname "$0")"

WORKLOADS=${WORKLOADS:-a,c,e,w}
CLIENTS=${CLIENTS:-64}
RECORDS=${RECORDS:-10000}
VALUESIZE=${VALUESIZE:-1000}
D=${D:-2s}
W=${W:-500ms}
PREWARM=${PREWARM:-1s}
ROUNDS=${ROUNDS:-3}
MATRICES=${MATRICES:-2}
DELAY=${DELAY:-0}
POOL=${POOL:-1}
HARNESS_GOGC=${GOGC:-400} # not exported: the systems under test (Kefir, etcd) keep their own GC settings
DIAGNOSTIC=${DIAGNOSTIC:-0}
NO_MAINTENANCE=${NO_MAINTENANCE:-1}
QUIESCE=${QUIESCE:-200ms}
DISTURBED=${DISTURBED:-0.25}
REMEASURE=${REMEASURE:-2}
REMEASURE_BUDGET=${REMEASURE_BUDGET:-20}
OUT=${OUT:-results/compare}
# Ports (each system's first; see peers/*.sh for the ports that follow it): knobs so a
# matrix can run beside other work that holds the defaults (KEFIR_HTTP_OFFSET and
# KEFIR_PEER_OFFSET, read by peers/kefir.sh, move a Kefir group's other ports).
PORT_REDIS_ALWAYS=${PORT_REDIS_ALWAYS:-6399} PORT_REDIS_NONE=${PORT_REDIS_NONE:-6409} PORT_REDIS_WAIT=${PORT_REDIS_WAIT:-6419}
PORT_KEFIR1=${PORT_KEFIR1:-6390} PORT_KEFIR3=${PORT_KEFIR3:-6590} PORT_ETCD=${PORT_ETCD:-2479}
PORT_ZK_SYNC=${PORT_ZK_SYNC:-2181} PORT_ZK_NOSYNC=${PORT_ZK_NOSYNC:-3181} PORT_SERVE=${PORT_SERVE:-6799}
DOCS=${DOCS:-}
REPORT_ONLY=${REPORT_ONLY:-} # 1: skip the measurements, rebuild the reports from OUT (after changing the report code)
# The standard matrix: one row per system and mode compared, plus one ceiling per client
# library. The diagnostic rows answer narrower questions and would cost the standard
# matrix time (and so length per cell, and so stability).
STANDARD="ceiling ceiling-redis redis-always redis-none redis-wait kefir-sync kefir-async kefir3-sync kefir3-cad kefir3-async etcd zk-sync zk-nosync"
DIAGNOSTIC_SYSTEMS="ceiling-proc ceiling-proc-redis kefir3-follower"
if [ "$DIAGNOSTIC" = 1 ]; then STANDARD="$STANDARD $DIAGNOSTIC_SYSTEMS"; fi
SYSTEMS=${SYSTEMS:-$STANDARD}
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$(date +%s)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kefir-compare.XXXXXX")
cleanup() {
  for p in redis-always redis-none redis-wait; do peers/redis.sh stop "$tmp/$p" >/dev/null 2>&1 || true; done
  [ -e "$tmp/serve.pid" ] && kill "$(cat "$tmp/serve.pid")" 2>/dev/null || true
  peers/kefir.sh stop "$tmp/kefir1" >/dev/null 2>&1 || true
  peers/kefir.sh stop "$tmp/kefir3" >/dev/null 2>&1 || true
  peers/etcd.sh stop "$tmp/etcd" >/dev/null 2>&1 || true
  peers/zookeeper.sh stop "$tmp/zk-sync" >/dev/null 2>&1 || true
  peers/zookeeper.sh stop "$tmp/zk-nosync" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
has() { [[ " $SYSTEMS " == *" $1 "* ]]; }

echo "== build"
go build -o "$tmp/ycsb" ./ycsb
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# What the report says produced it (a REPORT_ONLY run reports the measured run's settings).
sysarg=""
[ "$SYSTEMS" != "$STANDARD" ] && sysarg="SYSTEMS=\"$SYSTEMS\" " # a subset or another set: the command must say which
[ "$OUT" != results/compare ] && sysarg="${sysarg}OUT=$OUT "
cmdline="${sysarg}WORKLOADS=$WORKLOADS CLIENTS=$CLIENTS RECORDS=$RECORDS VALUESIZE=$VALUESIZE D=$D W=$W PREWARM=$PREWARM ROUNDS=$ROUNDS MATRICES=$MATRICES DELAY=$DELAY POOL=$POOL GOGC=$HARNESS_GOGC DIAGNOSTIC=$DIAGNOSTIC NO_MAINTENANCE=$NO_MAINTENANCE QUIESCE=$QUIESCE DISTURBED=$DISTURBED REMEASURE=$REMEASURE REMEASURE_BUDGET=$REMEASURE_BUDGET bench/compare.sh"
if [ -z "$REPORT_ONLY" ]; then
rm -rf "$OUT/rounds" "$OUT/plots"
mkdir -p "$OUT/rounds"
echo "$started" >"$OUT/started.txt"
echo "$cmdline" >"$OUT/cmdline.txt"
echo "$SYSTEMS" >"$OUT/systems.txt"
declare -p WORKLOADS CLIENTS RECORDS VALUESIZE D W PREWARM ROUNDS MATRICES DELAY POOL HARNESS_GOGC DIAGNOSTIC \
  NO_MAINTENANCE QUIESCE DISTURBED REMEASURE REMEASURE_BUDGET >"$OUT/settings.sh"
git -C .. rev-parse --short HEAD >"$OUT/kefir-rev.txt"
go build -o "$tmp/delaymesh" ./delaymesh
(cd .. && go build -o "$tmp/kefir" ./cmd/kefir)
export DELAYMESH="$tmp/delaymesh"

quiet=()
[ "$NO_MAINTENANCE" = 1 ] && quiet=(--no-maintenance)
echo "== start systems (delay $DELAY each way on every link; background maintenance $([ "$NO_MAINTENANCE" = 1 ] && echo off || echo on))"
declare -A addr args
if has redis-always; then
  addr[redis-always]=$(peers/redis.sh start "$tmp/redis-always" --port "$PORT_REDIS_ALWAYS" --fsync always ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[redis-always]="-db redis -durable yes -label redis(appendfsync-always)"
fi
if has redis-none; then
  addr[redis-none]=$(peers/redis.sh start "$tmp/redis-none" --port "$PORT_REDIS_NONE" --fsync off ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[redis-none]="-db redis -durable no -label redis(no-persistence)"
fi
if has redis-wait; then
  addr[redis-wait]=$(peers/redis.sh start "$tmp/redis-wait" --port "$PORT_REDIS_WAIT" --fsync everysec --replicas 2 ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[redis-wait]="-db redis -redis-wait 1 -durable no -label redis(everysec+2-replicas,WAIT-1)"
fi
if has kefir-sync || has kefir-async; then
  k1=$(peers/kefir.sh start "$tmp/kefir1" --port "$PORT_KEFIR1" ${quiet[@]+"${quiet[@]}"} --delay "$DELAY" --bin "$tmp/kefir")
  addr[kefir-sync]=$k1 addr[kefir-async]=$k1
  args[kefir-sync]="-db kefir -durability sync -consistency linearizable -label kefir-1-node(sync)"
  args[kefir-async]="-db kefir -durability async -consistency linearizable -label kefir-1-node(async)"
fi
if has kefir3-sync || has kefir3-cad || has kefir3-async || has kefir3-follower; then
  # 1 s view-change timeout, as Kefir's own test clusters use on a loaded box: with the
  # default 300 ms, CPU stalls on this shared machine depose leaders mid-run.
  k3=$(peers/kefir.sh start "$tmp/kefir3" --replicas 3 --port "$PORT_KEFIR3" --follower-reads --view-change-timeout 1s ${quiet[@]+"${quiet[@]}"} --delay "$DELAY" --bin "$tmp/kefir")
  for m in sync cad async follower; do addr[kefir3-$m]=$k3; done
  args[kefir3-sync]="-db kefir -durability sync -consistency linearizable -label kefir-3-replicas(sync,linearizable)"
  args[kefir3-cad]="-db kefir -durability cad -consistency linearizable -durable no -label kefir-3-replicas(cad,linearizable)"
  args[kefir3-async]="-db kefir -durability async -consistency linearizable -label kefir-3-replicas(async,linearizable)"
  args[kefir3-follower]="-db kefir -durability sync -consistency cross-client-monotonic -label kefir-3-replicas(sync,follower-reads)"
fi
if has etcd; then
  addr[etcd]=$(peers/etcd.sh start "$tmp/etcd" --members 3 --port "$PORT_ETCD" ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[etcd]="-db etcd -label etcd-3-members"
fi
if has zk-sync; then
  addr[zk-sync]=$(peers/zookeeper.sh start "$tmp/zk-sync" --port "$PORT_ZK_SYNC" --force-sync yes ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[zk-sync]="-db zookeeper -durable yes -label zookeeper-3-servers(forceSync=yes)"
fi
if has zk-nosync; then
  addr[zk-nosync]=$(peers/zookeeper.sh start "$tmp/zk-nosync" --port "$PORT_ZK_NOSYNC" --force-sync no ${quiet[@]+"${quiet[@]}"} --delay "$DELAY")
  args[zk-nosync]="-db zookeeper -durable no -label zookeeper-3-servers(forceSync=no)"
fi
if has ceiling-proc || has ceiling-proc-redis; then
  "$tmp/ycsb" -serve "127.0.0.1:$PORT_SERVE" >"$tmp/serve.log" 2>&1 &
  echo $! >"$tmp/serve.pid"
  for _ in $(seq 50); do grep -q serving "$tmp/serve.log" && break; sleep 0.1; done
  addr[ceiling-proc]=127.0.0.1:$PORT_SERVE addr[ceiling-proc-redis]=127.0.0.1:$PORT_SERVE
  args[ceiling-proc]="-db kefir -durable no -label respserver-process(via-kefir-client)"
  args[ceiling-proc-redis]="-db redis -durable no -label respserver-process(via-go-redis)"
fi
# Cost per operation (ycsb -server-pids, -metrics; bench/ycsb/cost.go): each system's own
# server processes, whose CPU time and bytes written are read from /proc before and after
# every measured window, and Kefir's /metrics for its fsync count. A delay proxy is not
# the system's: it is left out.
declare -A pids metrics
sys_pids() { # NAME GLOB: write the pids of DIR/GLOB into $tmp/pids-NAME
  cat $2 2>/dev/null >"$tmp/pids-$1" || true
  pids[$1]="-server-pids $tmp/pids-$1"
}
has redis-always && sys_pids redis-always "$tmp/redis-always/redis-*.pid"
has redis-none && sys_pids redis-none "$tmp/redis-none/redis-*.pid"
has redis-wait && sys_pids redis-wait "$tmp/redis-wait/redis-*.pid"
for s in kefir-sync kefir-async; do has $s && sys_pids $s "$tmp/kefir1/kefir-*.pid" && metrics[$s]="-metrics $(cat "$tmp/kefir1/metrics-urls")"; done
for s in kefir3-sync kefir3-cad kefir3-async kefir3-follower; do has $s && sys_pids $s "$tmp/kefir3/kefir-*.pid" && metrics[$s]="-metrics $(cat "$tmp/kefir3/metrics-urls")"; done
has etcd && sys_pids etcd "$tmp/etcd/etcd-*.pid"
has zk-sync && sys_pids zk-sync "$tmp/zk-sync/zk-*.pid"
has zk-nosync && sys_pids zk-nosync "$tmp/zk-nosync/zk-*.pid"
for s in ceiling-proc ceiling-proc-redis; do has $s && sys_pids $s "$tmp/serve.pid"; done
# The CPU watch's list of the matrix's own server processes (everything else is "other").
cat "$tmp"/*.pid "$tmp"/*/*.pid 2>/dev/null >"$tmp/watch-pids" || true
echo "watching $(wc -w <"$tmp/watch-pids") server processes"
args[ceiling]="-db respserver -via kefir -label respserver(via-kefir-client)"
args[ceiling-redis]="-db respserver -via redis -label respserver(via-go-redis)"

# Every system: the same workloads, clients, sizes, pool, warm-up and duration; the delay
# is emulated outside (delaymesh) and only declared to ycsb for its floors and tables.
common=(-workloads "$WORKLOADS" -clients "$CLIENTS" -records "$RECORDS" -valuesize "$VALUESIZE" -pool "$POOL"
  -link-delay "$DELAY" -warmup "$W" -d "$D" -load-clients 64 -limits-samples 0)
# One ycsb process drives every system (ycsb -matrix): for each round, workload and client
# count, each system runs the cell back to back before the next cell starts. A system that
# fails to connect or load, or a cell that fails, is listed in the report; the rest runs.
: >"$OUT/failures.txt"
for m in $(seq "$MATRICES"); do
  for s in $SYSTEMS; do
    # Load once per data set, in the first matrix: kefir-async and the kefir3 rows after
    # the first share their node's data; the in-process ceiling loads in every process.
    load=false
    if [ "$m" = 1 ]; then
      load=true
      case "$s" in
        kefir-async) has kefir-sync && load=false ;;
        kefir3-cad|kefir3-async|kefir3-follower) has kefir3-sync && load=false ;;
        ceiling-proc-redis) has ceiling-proc && load=false ;;
      esac
    fi
    extra=()
    [[ "$s" == ceiling* ]] && extra=(-link-delay 0) # in-process: no proxy, whatever DELAY is
    echo "${args[$s]} ${addr[$s]:+-addr ${addr[$s]}} ${common[*]} -load=$load ${pids[$s]:-} ${metrics[$s]:-} ${extra[*]}"
  done >"$OUT/rounds/matrix-$m.txt"
  echo "== matrix $m: $ROUNDS rounds ($(( $(date +%s) - t0 )) s so far, load average $(loadavg))"
  GOGC=$HARNESS_GOGC "$tmp/ycsb" -matrix "$OUT/rounds/matrix-$m.txt" -rounds "$ROUNDS" -prewarm "$PREWARM" -seed $((100 * m)) -limits-samples 300 \
    -watch-pids "$tmp/watch-pids" -disturbed "$DISTURBED" -remeasure "$REMEASURE" -remeasure-budget "$REMEASURE_BUDGET" -quiesce "$QUIESCE" \
    -json "$OUT/rounds/matrix-$m.json" -md "$OUT/rounds/matrix-$m.md" -failures "$OUT/rounds/failures-$m.txt" \
    >/dev/null 2>"$OUT/rounds/matrix-$m.log" || echo "!! matrix $m: ycsb exited $? (see $OUT/rounds/matrix-$m.log)" >&2
  grep -E '^(prewarm:|round| *[^ ]+ load |FAILED)' "$OUT/rounds/matrix-$m.log" || true
  echo "   $(grep -c 'measuring again' "$OUT/rounds/matrix-$m.log" || true) cells measured again (CPU watch)"
  sed "s/^- /- matrix $m: /" "$OUT/rounds/failures-$m.txt" >>"$OUT/failures.txt" 2>/dev/null || true
  loads=$(grep -o '^round [0-9]* of [0-9]*: load average .*' "$OUT/rounds/matrix-$m.log" | sed 's/: load average /: /' | paste -sd';' - | sed 's/;/; /g')
  echo "load average (1, 5, 15 min) at the start of each round: ${loads:-unknown}; at the end: $(loadavg)" >"$OUT/loadavg-$m.txt"
done
echo $(( $(date +%s) - t0 )) >"$OUT/elapsed.txt"
fi # REPORT_ONLY

if [ -n "$REPORT_ONLY" ]; then
  source "$OUT/settings.sh" # the measured run's settings
  PREWARM=${PREWARM:-0} HARNESS_GOGC=${HARNESS_GOGC:-${GOGC:-100}} DIAGNOSTIC=${DIAGNOSTIC:-0} # runs from before these knobs
  NO_MAINTENANCE=${NO_MAINTENANCE:-0} QUIESCE=${QUIESCE:-0}
fi
started=$(cat "$OUT/started.txt")
cmdline=$(cat "$OUT/cmdline.txt")
elapsed=$(cat "$OUT/elapsed.txt")
rm -rf "$OUT/plots"
for m in $(seq "$MATRICES"); do
  note=$(cat "$OUT/loadavg-$m.txt")
  "$tmp/ycsb" -summarize "$OUT/summary-$m.json" -md "$OUT/summary-$m.md" -md-compact "$OUT/summary-$m.compact.md" -note "$note" \
    "$OUT/rounds/matrix-$m.json" >/dev/null 2>"$OUT/summary-$m.log" || { cat "$OUT/summary-$m.log" >&2; exit 1; }
done
# Plots from matrix 1, round 1 (one curve per system, not one per round).
"$tmp/ycsb" -plot "$OUT/plots" "$OUT/rounds/matrix-1.json" >/dev/null
agree_rc=0
if [ "$MATRICES" -ge 2 ]; then
  "$tmp/ycsb" -agree "$OUT/summary-1.json,$OUT/summary-2.json" -md "$OUT/agreement.md" -md-compact "$OUT/agreement.compact.md" >/dev/null || agree_rc=$?
fi

netnote="none: loopback, no delay proxy"
case "$DELAY" in 0|0s) ;; *) netnote="$DELAY one way on every client link and every peer link (bench/delaymesh proxies; member lists name the proxies)" ;; esac
header() {
  echo "### Standard YCSB matrix — $started, $(nproc) CPUs, $elapsed s"
  echo
  echo "Produced by \`$cmdline\` (from the repository root; \`make compare\` runs it and regenerates this section)."
  echo "Kefir at $(cat "$OUT/kefir-rev.txt"). Network distance: **$netnote**, the same for every system."
  echo "Each cell: $ROUNDS rounds of $D measured after $W warm-up; before round 1 every system ran every workload for"
  echo "$PREWARM unmeasured (prewarm). One ycsb process (GOGC=$HARNESS_GOGC) drives every system and runs each cell on every system"
  echo "back to back (order rotated per round) before the next cell; the median of the rounds is reported, and \"round"
  echo "spread\" is max ÷ min − 1 of a cell's round throughputs. Records: $RECORDS × $VALUESIZE B, loaded once per system."
  echo "Closed loop; every system's servers run all the time (an idle 3-replica Kefir group still costs 0.1-0.25 cores: 10 ms heartbeats)."
  if [ "$NO_MAINTENANCE" = 1 ]; then
    echo "Background maintenance off in every system (NO_MAINTENANCE=1): Kefir --compact-interval=-1s --checkpoint-interval=-1s,"
    echo "Redis auto-aof-rewrite-percentage 0, etcd --snapshot-count 100000000, ZooKeeper snapCount=100000000 and no autopurge."
  fi
  echo "Pause before each cell: $QUIESCE. CPU watch: a round during which processes outside the matrix used more than $DISTURBED cores"
  echo "was measured again (at most $REMEASURE times per round, $REMEASURE_BUDGET per matrix; the least disturbed kept)."
  echo "Connection model per driver, as its users would set it up: Kefir rows and respserver(via-kefir-client) use one"
  echo "Kefir client with $POOL connection(s), on which it pipelines the concurrent calls; Redis rows and"
  echo "respserver(via-go-redis) use one go-redis client whose pool has one connection per client (go-redis sends one call"
  echo "at a time per connection); etcd one clientv3 (one gRPC connection, multiplexed); ZooKeeper one go-zookeeper session"
  echo "(one connection to one server, pipelined: ZooKeeper's usual one session per process; sessions are costly to the"
  echo "ensemble). Each respserver row bounds the rows driven by the same client library."
  echo "Part of any gap between client libraries is the client, not the server."
  echo
  echo "Durability per row: redis(appendfsync-always) and kefir sync fsync before the reply; redis(no-persistence) and"
  echo "kefir async never wait for a disk; kefir cad replies before its fsync but reads never see what a crash could undo;"
  echo "redis WAIT 1 waits for one replica's receipt (everysec fsync); etcd and zookeeper(forceSync=yes) fsync on a majority"
  echo "before the ack; zookeeper(forceSync=no) replicates to a majority without fsync. ZooKeeper reads are local to the"
  echo "server a session is connected to (sequentially consistent, may be stale), unlike Kefir's and etcd's linearizable"
  echo "reads; ZooKeeper has no range read, so workload E is marked not supported for it (not emulated)."
}
{
  header
  for m in $(seq "$MATRICES"); do
    echo
    echo "#### Matrix $m"
    echo
    echo "$(cat "$OUT/loadavg-$m.txt")."
    echo
    cat "$OUT/summary-$m.md"
  done
  if [ -s "$OUT/failures.txt" ]; then
    echo
    echo "**Failed invocations** (their cells are missing from that round; logs in \`bench/$OUT/rounds/\`):"
    echo
    cat "$OUT/failures.txt"
  fi
  if [ -e "$OUT/agreement.md" ]; then
    echo
    echo "#### Reproducibility: matrix 1 vs matrix 2"
    echo
    cat "$OUT/agreement.md"
  fi
  echo
  echo "Plots (matrix 1, round 1; \`go run ./ycsb -plot $OUT/plots $OUT/rounds/matrix-1.json\` from bench/):"
  for p in "$OUT"/plots/*.png; do [ -e "$p" ] && echo "[$(basename "$p")](../bench/$p)"; done | paste -sd' ' -
  echo
  echo "Raw figures: \`bench/$OUT/rounds/matrix-*.json\` (every round of every cell; each names its ycsb command and matrix file), \`summary-*.json\`."
} >"$OUT/compare.md"
# The results page (docs/benchmarks.md) gets the claims, not every table: each Kefir row ÷
# the peer row whose durability it matches (the pairs below, as in the system list at the
# top), per matrix; matrix 1's totals; the agreement verdict; the plots. compare.md keeps
# everything else.
PAIRS="kefir-1-node(sync)/redis(appendfsync-always);kefir-1-node(async)/redis(no-persistence)"
PAIRS="$PAIRS;kefir-3-replicas(cad,linearizable)/redis(everysec+2-replicas,WAIT-1)"
PAIRS="$PAIRS;kefir-3-replicas(sync,linearizable)/etcd-3-members;kefir-3-replicas(sync,linearizable)/zookeeper-3-servers(forceSync=yes)"
PAIRS="$PAIRS;kefir-3-replicas(cad,linearizable)/zookeeper-3-servers(forceSync=no)"
summaries=()
for m in $(seq "$MATRICES"); do summaries+=("$OUT/summary-$m.json"); done
"$tmp/ycsb" -ratios "$PAIRS" -md "$OUT/ratios.md" "${summaries[@]}" >/dev/null
{
  echo "### YCSB matrix — $started, $(nproc) CPUs, $elapsed s (generated by \`make compare\`)"
  echo
  echo "Kefir at $(cat "$OUT/kefir-rev.txt"). Command: \`$cmdline\` (\`make compare\` runs it and rewrites this section)."
  echo "Every system on this machine at once, driven by one ycsb process; each cell $ROUNDS rounds of $D interleaved"
  echo "across systems, medians reported; $RECORDS records × $VALUESIZE B, closed loop. Network distance: $netnote."
  echo "Method, connection model and durability of every row, p50/p99 per operation, round spreads and the CPU"
  echo "watch: [bench/$OUT/compare.md](../bench/$OUT/compare.md)."
  echo
  if [ -s "$OUT/ratios.md" ]; then
    echo "**Kefir ÷ the peer with matching durability**, median total ops/s per cell$([ "$MATRICES" -ge 2 ] && echo ", matrix 1 / matrix 2"):"
    echo
    # Throughput and server CPU ratios here; the bytes ratios are in compare.md.
    awk '/^\*\*write_bytes per write/ { exit } { print }' "$OUT/ratios.md"
  fi
  echo "**Matrix 1: median total ops/s (median p50 of the first operation type).** $(cat "$OUT/loadavg-1.txt")."
  echo
  # The per-row cost table (CPU µs, fsyncs, bytes per operation) stays in compare.md:
  # the page keeps to the claims (issue 31: at most ~300 lines).
  # So does the harness-ceiling table (issue 8's check of the harness, not a claim).
  awk -v link="[bench/$OUT/compare.md](../bench/$OUT/compare.md)" '
    /^Cost per operation/ { print "Cost per operation of every row (server CPU µs, fsyncs and bytes per operation, server and harness cores), and the harness ceiling: " link "."; skip = 1; next }
    /^CPU-bound here:/ { if (skip) print ""; skip = 0 }
    /^Harness ceiling/ { skip = 2; next }
    skip == 2 && /^$/ { if (seen) { skip = 0 } ; seen = 1; next }
    !skip { print }' "$OUT/summary-1.compact.md"
  if [ -e "$OUT/agreement.compact.md" ]; then
    echo
    echo "Matrix 1 against matrix 2 (the same run, back to back): $(sed -n '1s/ Every row is in the full table.*//p' "$OUT/agreement.compact.md")"
  fi
  if [ -s "$OUT/failures.txt" ]; then
    echo
    echo "**Failed invocations** (their cells are missing from that round):"
    echo
    cat "$OUT/failures.txt"
  fi
  echo
  echo "Plots of matrix 1 (\`go run ./ycsb -plot $OUT/plots $OUT/rounds/matrix-1.json\` from bench/): throughput per"
  echo "workload, the bar at the median of the rounds, the error bar from the lowest round to the highest:"
  echo
  for p in "$OUT"/plots/throughput-*.png; do [ -e "$p" ] && echo "![$(basename "$p" .png)](../bench/$p)"; done
  echo
  echo "Latency CDFs of the first round, at most 6 lines each (single node and Redis; replicated; harness ceilings):"
  for p in "$OUT"/plots/cdf-*.png; do [ -e "$p" ] && echo "[$(basename "$p" .png)](../bench/$p)"; done | paste -sd' ' -
} >"$OUT/docs-section.md"
if [ -n "$DOCS" ]; then
  "$tmp/ycsb" -splice "$DOCS" -section ycsb-compare <"$OUT/docs-section.md"
  echo "== spliced into $DOCS"
fi
echo "== wrote $OUT/compare.md in $elapsed s"
exit "$agree_rc"
