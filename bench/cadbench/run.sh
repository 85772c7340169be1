#!/usr/bin/env bash
# Issue 7's performance measurement in one script: three `kefir server` replicas on
# loopback, YCSB cells with the durability levels interleaved per cell (sync, cad, async)
# and rounds, one Markdown table with ratios, the fraction of reads that waited for the
# CAD durability check, and the load average around every cell.
#
#   bench/cadbench/run.sh writes [options]   # sync / cad / async on workloads W, A, F (B, D)
#   bench/cadbench/run.sh reads  [options]   # workload C: linearizable at the leader vs
#                                            # cross-client-monotonic served by followers
#
# Options:
#   --workloads "w a f"   YCSB workloads (writes mode; reads mode always runs c)
#   --clients "10 64"     closed-loop client counts
#   --levels "sync cad async"   durability levels, measured in this order within each cell
#   --rounds 2            every cell is measured once per round
#   --d 5s                measured duration of a cell
#   --records 20000       records loaded once (every cell shares the key space)
#   --dir DIR             scratch directory (default /tmp/cadbench.$$; removed at the end)
#   --port 17480          client ports PORT..PORT+2, peer PORT+100.., HTTP PORT+200..
#   --cpu-quota PCT       cap every replica at PCT % of one core with a cgroup v1 CPU
#                         quota (cfs_quota/cfs_period; /sys/fs/cgroup/cpu/kefir-cadbench-rN):
#                         each replica then emulates its own small machine and the
#                         servers, not the client, are the bottleneck (reads mode). 0: none.
#   --gomaxprocs N        GOMAXPROCS of every replica (empty: Go's default, the core count)
#   --bin PATH            kefir binary (default: go build ./cmd/kefir into DIR, with
#                         -tags cadtrace when KEFIR_CADTRACE is set)
#   --profile PDIR        also take a CPU profile of every replica during each cell
#                         (PDIR/<round>-<workload>-<clients>-<level>-n<i>.pprof, the cell's
#                         duration minus 1 s; profiling costs a little CPU itself)
#   --follower-reads      writes mode: run the group with --follower-reads, as the standard
#                         YCSB matrix does (R then waits for every active-set member)
#   --fsync-extra-delay D every replica sleeps D after each fsync before the data counts as
#                         durable (kefir server --fsync-extra-delay): a slower disk than
#                         this machine's, e.g. 1ms for the SSDs of the CAD paper (digest 003
#                         §5.2: make the run latency-bound, not CPU-bound). Default 0.
#   --server-args "ARGS"  more `kefir server` flags for every replica (word-split), e.g.
#                         "--cad-sync-delay 0"
#   --pool N              connections of ycsb's Kefir client (0: its default, 4); the
#                         client pipelines its clients' calls over them, and the server runs
#                         each connection's commands in order (docs/design/cad.md §9)
#
# Timeline of every op (append, fsyncs, commit, apply, R, durability waits; cad.md §9):
# run with KEFIR_CADTRACE=1 --dir DIR: the script builds kefir with -tags cadtrace
# (internal/vrshard/cadtrace.go; the default build compiles no-op hooks), sends every
# replica SIGUSR1 after the load and after each cell, and each prints its percentiles for
# that cell to DIR/n<i>.log. A --bin built without the tag dies of that SIGUSR1.
#
# Every measuring run must hold the shared bench lock; wrap the whole script:
#   flock /tmp/kefir-bench.lock bench/cadbench/run.sh writes --workloads w --clients 10
# Keep one invocation short (a cell is --d plus ~1 s; 2 rounds × 3 levels × 2 client
# counts × 3 workloads × 5 s ≈ 4 min).
#
# "log fsyncs/op" is the three replicas' replication-log fsyncs (/status log_fsyncs) over
# the cell's operations; like the CPU figure it counts ycsb's warm-up too.
# "reads waited" is the leader's reads_durability_wait counter (/status) over the reads
# the cell made (cad only: sync data is durable when acknowledged, async reads skip the check).
# In reads mode "by followers" is the followers' follower_reads_served over the reads. The
# counter also counts ycsb's warm-up (2 s by default) and the reads only the measured --d, so
# with two thirds of reads at followers it reads ≈ (2 + d) / d × 67 %, above 100 % for short cells.
set -euo pipefail

mode=${1:-}
case "$mode" in writes | reads) shift ;; *) sed -n '2,49p' "$0"; exit 2 ;; esac
workloads="w a f"; clients="10 64"; levels="sync cad async"; rounds=2; dur=5s
records=20000; fxd=0; sargs=""; pool=0; dir=""; port=17480; quota=0; gmp=""; bin=""; prof=""; fr=false
while [ $# -gt 0 ]; do
  case "$1" in
    --workloads) workloads=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --levels) levels=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --d) dur=$2; shift 2 ;;
    --records) records=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --cpu-quota) quota=$2; shift 2 ;;
    --gomaxprocs) gmp=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --profile) prof=$2; shift 2 ;;
    --pool) pool=$2; shift 2 ;;
    --fsync-extra-delay) fxd=$2; shift 2 ;;
    --server-args) sargs=$2; shift 2 ;;
    --follower-reads) fr=true; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ -n "$dir" ] || dir=/tmp/cadbench.$$
mkdir -p "$dir"
if [ -z "$bin" ]; then
  bin="$dir/kefir"
  tags=()
  [ -z "${KEFIR_CADTRACE:-}" ] || tags=(-tags cadtrace)
  (cd "$root" && go build "${tags[@]}" -o "$bin" ./cmd/kefir)
fi
ycsb="$dir/ycsb"
(cd "$root/bench" && go build -o "$ycsb" ./ycsb)

cport() { echo $((port + $1 - 1)); }
pport() { echo $((port + 100 + $1 - 1)); }
hport() { echo $((port + 200 + $1 - 1)); }
addrs=""
members=""
for i in 1 2 3; do
  members+="${members:+,}$i@127.0.0.1:$(pport $i)/127.0.0.1:$(cport $i)"
  addrs+="${addrs:+,}127.0.0.1:$(cport $i)"
done

pids=()
cgroups=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  for cg in "${cgroups[@]}"; do rmdir "$cg" 2>/dev/null || true; done
  case "$dir" in /tmp/cadbench.*) rm -rf "$dir" ;; esac
}
trap cleanup EXIT

follower=$fr
[ "$mode" = reads ] && follower=true
# A port already in use would let ycsb measure whatever holds it (another
# group left running) while this script's servers fail to bind: refuse.
for i in 1 2 3; do
  for p in $(cport $i) $(pport $i) $(hport $i); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$0: port $p is in use (another cluster running?); pick another --port" >&2
      exit 1
    fi
  done
done
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
cluster=$((($(od -An -N4 -tu4 /dev/urandom) % 1000000) + 1))
for i in 1 2 3; do
  args=(server --node-id "n$i" --dir "$dir/n$i" --client-addr "127.0.0.1:$(cport $i)"
    --http-addr "127.0.0.1:$(hport $i)" --log-level warn
    --peer-addr "127.0.0.1:$(pport $i)" --members "$members" --replica-id "$i" --cluster-id "$cluster"
    --follower-reads="$follower" --view-change-timeout 1s --bootstrap=true)
  # Only when asked: binaries older than the flag (A/B runs) refuse it.
  [ "$fxd" = 0 ] || args+=(--fsync-extra-delay "$fxd")
  if [ -n "$sargs" ]; then read -ra extra <<<"$sargs"; args+=("${extra[@]}"); fi
  if [ -n "$gmp" ]; then
    GOMAXPROCS=$gmp KEFIR_CLUSTER_SECRET=$secret "$bin" "${args[@]}" >"$dir/n$i.log" 2>&1 &
  else
    KEFIR_CLUSTER_SECRET=$secret "$bin" "${args[@]}" >"$dir/n$i.log" 2>&1 &
  fi
  pids+=($!)
  if [ "$quota" != 0 ]; then
    cg=/sys/fs/cgroup/cpu/kefir-cadbench-r$i
    mkdir -p "$cg"
    echo 100000 >"$cg/cpu.cfs_period_us"
    echo $((quota * 1000)) >"$cg/cpu.cfs_quota_us"
    echo "${pids[-1]}" >"$cg/cgroup.procs"
    cgroups+=("$cg")
  fi
done

status() { curl -fsS "http://127.0.0.1:$(hport "$1")/status"; }
# leader: the replica that says it leads (1-based), after the group settled.
leader() {
  for _ in $(seq 200); do
    for i in 1 2 3; do
      if [ "$(status "$i" 2>/dev/null | jq -r '.replication.role // empty')" = leader ]; then echo "$i"; return; fi
    done
    sleep 0.1
  done
  echo "no leader" >&2
  return 1
}
lead=$(leader)
for pid in "${pids[@]}"; do
  kill -0 "$pid" 2>/dev/null || { echo "$0: a server exited at start; logs in $dir" >&2; tail -3 "$dir"/n*.log >&2; exit 1; }
done
sleep 1 # followers hear the leader's first heartbeats

"$ycsb" -db kefir -addr "$addrs" -records "$records" -load-only -durability sync -limits-samples 0 >"$dir/load.txt"
if [ -n "${KEFIR_CADTRACE:-}" ]; then for pid in "${pids[@]}"; do kill -USR1 "$pid"; done; fi
cad_counter() { status "$1" | jq -r ".replication.cad.$2"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# cpu_ticks: user+system CPU of the three replicas so far, in clock ticks.
cpu_ticks() {
  local t=0 pid
  for pid in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  echo "$t"
}
hz=$(getconf CLK_TCK)
# log_fsyncs: replication-log fsyncs of the three replicas so far (/status).
log_fsyncs() {
  local t=0 i
  for i in 1 2 3; do t=$((t + $(status "$i" | jq -r '.replication.log_fsyncs // 0'))); done
  echo "$t"
}

# cell WORKLOAD CLIENTS LEVEL CONSISTENCY: one measured run; prints
# "ops/s reads waited byfollowers load p50write cpu-µs/op" (p50write: UPDATE or INSERT,
# READ-MODIFY-WRITE on F) (cpu: the three replicas' CPU
# time over the cell's operations: on a CPU-bound box throughput follows it).
cell() {
  local w=$1 c=$2 lvl=$3 cons=$4 lead
  lead=$(leader)
  local w0 f0=0
  w0=$(cad_counter "$lead" reads_durability_wait)
  for i in 1 2 3; do [ "$i" = "$lead" ] || f0=$((f0 + $(cad_counter "$i" follower_reads_served))); done
  local t0 ppids=()
  if [ -n "$prof" ]; then
    mkdir -p "$prof"
    local secs=$((${dur%s} - 1))
    for i in 1 2 3; do
      curl -fsS -o "$prof/$r-$w-$c-$lvl-n$i.pprof" "http://127.0.0.1:$(hport "$i")/debug/pprof/profile?seconds=$secs" &
      ppids+=($!)
    done
  fi
  t0=$(cpu_ticks)
  local s0
  s0=$(log_fsyncs)
  "$ycsb" -db kefir -addr "$addrs" -records "$records" -load=false -d "$dur" -workloads "$w" \
    -clients "$c" -pool "$pool" -consistency "$cons" -durability "$lvl" -limits-samples 0 -json "$dir/cell.json" >"$dir/cell.txt" 2>&1 ||
    { echo "ycsb failed:" >&2; tail -5 "$dir/cell.txt" >&2; echo "0 0 0 0 $(load1) 0 0 0"; return; }
  local t1 w1 f1=0 s1
  t1=$(cpu_ticks)
  s1=$(log_fsyncs)
  if [ -n "${KEFIR_CADTRACE:-}" ]; then for pid in "${pids[@]}"; do kill -USR1 "$pid"; done; fi
  for pid in "${ppids[@]}"; do wait "$pid" || echo "profile failed" >&2; done
  w1=$(cad_counter "$lead" reads_durability_wait)
  for i in 1 2 3; do [ "$i" = "$lead" ] || f1=$((f1 + $(cad_counter "$i" follower_reads_served))); done
  local ops reads p50
  ops=$(jq '[.. | objects | select(.phase? == "run")][0].ops_per_sec' "$dir/cell.json")
  reads=$(jq '[.. | objects | select(.phase? == "run")][0].per_op | map(select(.op == "READ")) | (.[0].count // 0)' "$dir/cell.json")
  p50=$(jq '[.. | objects | select(.phase? == "run")][0].per_op | map(select(.op == "UPDATE" or .op == "INSERT" or .op == "READ-MODIFY-WRITE")) | (.[0].p50_us // 0)' "$dir/cell.json")
  local n
  n=$(jq '[.. | objects | select(.phase? == "run")][0].ops' "$dir/cell.json")
  echo "$ops $reads $((w1 - w0)) $((f1 - f0)) $(load1) $p50 $(((t1 - t0) * 1000000 / hz / (n > 0 ? n : 1))) $(awk -v s=$((s1 - s0)) -v n="$n" 'BEGIN{printf "%.3f", (n > 0 ? s / n : 0)}')"
}

results="$dir/results.txt"
: >"$results"
echo "# $(date -u +%FT%TZ) mode=$mode quota=${quota}% fsync-extra-delay=$fxd server-args='$sargs' gomaxprocs=${gmp:-default} leader=n$lead $(uptime)" >&2
for r in $(seq "$rounds"); do
  for w in $([ "$mode" = reads ] && echo c || echo "$workloads"); do
    for c in $clients; do
      if [ "$mode" = reads ]; then
        for cons in linearizable cross-client-monotonic; do
          line=$(cell "$w" "$c" sync "$cons")
          echo "$r $w $c $cons $line" | tee -a "$results" >&2
        done
      else
        for lvl in $levels; do
          line=$(cell "$w" "$c" "$lvl" linearizable)
          echo "$r $w $c $lvl $line" | tee -a "$results" >&2
        done
      fi
    done
  done
done

# Table: per workload and client count, each level's ops/s per round, the medians'
# ratios, reads waited (cad), load average range.
python3 - "$mode" "$results" <<'EOF'
import sys, statistics as st
mode, path = sys.argv[1], sys.argv[2]
rows = {}
order = []
for line in open(path):
    r, w, c, lvl, ops, reads, waited, byf, load, p50, cpu, fs = line.split()
    k = (w, int(c))
    if k not in rows:
        rows[k] = {}
        order.append(k)
    rows[k].setdefault(lvl, []).append((float(ops), int(reads), int(waited), int(byf), float(load), float(p50), float(cpu), float(fs)))
def med(xs): return st.median(xs) if xs else 0
def ops(v): return "/".join(f"{x[0]:,.0f}" for x in v)
if mode == "writes":
    lv = [l for l in ["sync", "cad", "async"] if any(l in rows[k] for k in order)]
    print("| workload | clients | " + " | ".join(f"{l} ops/s" for l in lv) + " | cad ÷ sync | cad ÷ async | write p50 sync/cad/async (µs) | server CPU µs/op sync/cad/async | log fsyncs/op sync/cad/async | reads waited (cad) | load |")
    print("|---|---:|" + "---|" * len(lv) + "---:|---:|---|---|---|---:|---|")
    for k in order:
        d = rows[k]
        m = {l: med([x[0] for x in d.get(l, [])]) for l in lv}
        ratio = lambda a, b: f"{m[a] / m[b]:.2f}" if m.get(a) and m.get(b) else "–"
        cad = d.get("cad", [])
        reads, waited = sum(x[1] for x in cad), sum(x[2] for x in cad)
        frac = f"{100 * waited / reads:.1f} % ({waited}/{reads})" if reads else "–"
        p50 = "/".join(f"{med([x[5] for x in d.get(l, [])]):.0f}" for l in ["sync", "cad", "async"] if l in d)
        cpu = "/".join(f"{med([x[6] for x in d.get(l, [])]):.0f}" for l in ["sync", "cad", "async"] if l in d)
        fs = "/".join(f"{med([x[7] for x in d.get(l, [])]):.2f}" for l in ["sync", "cad", "async"] if l in d)
        loads = [x[4] for l in lv for x in d.get(l, [])]
        print(f"| {k[0].upper()} | {k[1]} | " + " | ".join(ops(d.get(l, [])) for l in lv) +
              f" | {ratio('cad', 'sync')} | {ratio('cad', 'async')} | {p50} | {cpu} | {fs} | {frac} | {min(loads):.1f}–{max(loads):.1f} |")
    print("\nops/s per round (r1/r2/...); ratios of the medians over rounds.")
else:
    print("| clients | linearizable at leader ops/s | cross-client-monotonic ops/s | ccm ÷ lin | served by followers | server CPU µs/op lin/ccm | load |")
    print("|---:|---|---|---:|---:|---|---|")
    for k in order:
        d = rows[k]
        lin, ccm = d.get("linearizable", []), d.get("cross-client-monotonic", [])
        ml, mc = med([x[0] for x in lin]), med([x[0] for x in ccm])
        reads, byf = sum(x[1] for x in ccm), sum(x[3] for x in ccm)
        loads = [x[4] for x in lin + ccm]
        cpu = f"{med([x[6] for x in lin]):.0f}/{med([x[6] for x in ccm]):.0f}"
        print(f"| {k[1]} | {ops(lin)} | {ops(ccm)} | {mc / ml if ml else 0:.2f} | {100 * byf / max(1, reads):.0f} % | {cpu} | {min(loads):.1f}–{max(loads):.1f} |")
EOF
echo "# done $(date -u +%FT%TZ) $(uptime)" >&2
