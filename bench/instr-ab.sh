#!/usr/bin/env bash
# Instructions per request of a single Kefir node (or redis-server) under redis-benchmark,
# counted by valgrind's cachegrind: a cost per operation that the machine's load does not
# move as it moves CPU µs per request and req/s. It repeats within a few per cent, not
# exactly: the batches a pipelined load forms vary with timing, and per-batch costs with
# them — run each binary twice or more. Use it for A/B
# runs of two builds, and for "which function grew" (the per-function difference).
#
# Usage: bench/instr-ab.sh [-t TEST] [-n REQUESTS] [-P PIPELINE] [-r KEYSPACE] [-F] [-Q] [-p PORT] [-d DURABILITY] BIN [BIN2]
#   TEST: a redis-benchmark test (set, get, hset, ...; default set), or hget (HGET myhash
#   element:__rand_int__, as bench/hash-vs-redis.sh runs it), or setex (SET key:__rand_int__
#   xxx EX 100000: -t set's command with a TTL; -F fills with SET). get and hget read a key
#   (and field) written before the run, as redis-benchmark's own keys (without -r).
#   -r: redis-benchmark's -r (random keys or fields in a space of that size; 0: one key).
#   -F: fill first, as bench/hash-vs-redis.sh does (SET or HSET of 2×KEYSPACE random keys or
#   fields: a get then mostly hits, an hset mostly overwrites), and subtract what a run of the
#   fill alone counts (each binary runs twice).
#   Counts miss what memory stalls cost: a large keyspace's cache misses are not instructions.
#   -Q: Kefir without its time-driven background (--compact-interval, --checkpoint-interval
#   and --active-expiry all -1s): under valgrind a run lasts long enough for a compaction or
#   a checkpoint to land in one binary's run and not the other's, thousands of instructions a
#   request, and the expiry sampler's walk moves a count by ±150 from run to run.
#   BIN:  a kefir binary, or the word "redis" for redis-server (appendonly no).
#   With two binaries it prints both counts, their ratio, and the functions whose
#   instruction counts differ by more than 0.2 % of the first's total (main module only).
#
# Prints, per binary: instructions per request over the whole process (startup and the
# Go runtime included: GC and the scheduler vary a few per cent between runs) and over
# Kefir's own code (github.com/kefirdb/kefir/...). With -F compare Kefir's code: the whole
# process also counts the runtime's idle spinning, which lasts as long as a run does on a
# loaded box and which the fill-only run's subtraction does not cancel (it can come out
# thousands off, even negative).
# Needs: valgrind (apt-get install valgrind), redis-benchmark, redis-cli. Runs at ~1/50 speed:
# 100k requests take ~30 s per binary. Go's asynchronous preemption is off under valgrind
# (GODEBUG=asyncpreemptoff=1: callgrind and cachegrind do not survive its signals).
set -euo pipefail

TEST=set N=100000 PIPE=16 PORT=27650 DUR=async RAND=0 FILL=0 QUIET=()
while getopts "t:n:P:r:p:d:FQ" o; do
  case $o in
    t) TEST=$OPTARG ;; n) N=$OPTARG ;; P) PIPE=$OPTARG ;; r) RAND=$OPTARG ;; p) PORT=$OPTARG ;; d) DUR=$OPTARG ;; F) FILL=1 ;;
    Q) QUIET=(--compact-interval=-1s --checkpoint-interval=-1s --active-expiry=-1s) ;;
    *) sed -n '2,35p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,35p' "$0"; exit 2; }
for t in valgrind cg_annotate redis-benchmark redis-cli; do
  command -v $t >/dev/null || { echo "instr-ab: $t not found (apt-get install valgrind redis-tools)" >&2; exit 2; }
done
WORK=$(mktemp -d /tmp/instr-ab.XXXX)
trap 'rm -rf "$WORK"' EXIT

# count BIN OUT: runs BIN under cachegrind with the benchmark, leaves OUT.txt with
# "function instructions" per line (summed over its inlined lines); with -F, the counts of
# a fill-and-benchmark run less those of a fill-only run.
count() {
  if [ "$FILL" = 1 ]; then
    run "$1" "$2.fill" 0
    run "$1" "$2" 1
    LC_ALL=C join -a1 -a2 -e0 -o 0,1.2,2.2 "$2.txt" "$2.fill.txt" | awk '{print $1, $2 - $3}' >"$2.diff"
    mv "$2.diff" "$2.txt"
  else
    run "$1" "$2" 1
  fi
}

# run BIN OUT BENCH: count's run of BIN, with the benchmark itself if BENCH is 1.
run() {
  local bin=$1 out=$2 bench=$3 dir=$WORK/data.$RANDOM
  mkdir -p "$dir"
  if [ "$bin" = redis ]; then
    GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$out" \
      redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$out.log" 2>&1 &
  else
    GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$out" \
      "$bin" server --client-addr 127.0.0.1:"$PORT" --peer-addr "" --http-addr "" --dir "$dir" \
      --durability "$DUR" "${QUIET[@]}" >"$out.log" 2>&1 &
  fi
  local pid=$!
  for _ in $(seq 600); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  # A server that did not start (its port taken: in most kernels' ephemeral range, an outgoing
  # connection may hold it) must stop the run: redis-benchmark would retry it forever.
  redis-cli -p "$PORT" ping >/dev/null 2>&1 || { echo "instr-ab: no server on port $PORT (see $out.log)" >&2; cat "$out.log" >&2; kill "$pid" 2>/dev/null; exit 1; }
  local r=()
  [ "$RAND" -gt 0 ] && r=(-r "$RAND")
  if [ "$FILL" = 1 ]; then
    local f=set
    case $TEST in hset | hget) f=hset ;; esac
    redis-benchmark -p "$PORT" -c 50 -P "$PIPE" -n $((2 * RAND + 1)) "${r[@]}" -q -t $f >/dev/null 2>&1
  else
    case $TEST in
      get) redis-cli -p "$PORT" set key:__rand_int__ xxx >/dev/null ;;
      hget) redis-cli -p "$PORT" hset myhash element:__rand_int__ xxx >/dev/null ;;
    esac
  fi
  # redis-benchmark has no HGET test: it is given as a command, as bench/hash-vs-redis.sh does.
  local t=(-t "$TEST")
  [ "$TEST" = hget ] && t=(hget myhash element:__rand_int__)
  [ "$TEST" = setex ] && t=(set key:__rand_int__ xxx ex 100000)
  [ "$bench" = 1 ] && redis-benchmark -p "$PORT" -c 50 -P "$PIPE" -n "$N" "${r[@]}" -q "${t[@]}" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  [ -s "$out" ] || { echo "instr-ab: no counts from $bin (see $out.log)" >&2; cat "$out.log" >&2; exit 1; }
  # --threshold=0: every function. cg_annotate's default lists only those above 0.1 % of the
  # run's total, and a fill-only run (-F) whose idle Go runtime spun longer listed fewer:
  # what it dropped was not subtracted (a per-call function counted 3× in one run, once in
  # the next; before session 25 every -F figure could carry such errors).
  cg_annotate --show-percs=no --threshold=0 --auto=no "$out" 2>/dev/null | grep -E '^\s*[0-9,]+ +[^ ]*:' |
    sed -E 's/^ *([0-9,]+) +[^:]*:(.*)$/\1 \2/' | tr -d ',' |
    awk 'NF == 2 {a[$2]+=$1} END {for (k in a) print k, a[k]}' | LC_ALL=C sort >"$out.txt"
}

report() {
  local name=$1 f=$2
  awk -v n="$N" -v name="$name" '{t+=$2} /kefirdb\/kefir/ {k+=$2}
    END {printf "%s: %.0f instructions per request (%.0f in Kefir code), %s %s, -P %s\n", name, t/n, k/n, n, ENVIRON["TEST"], ENVIRON["PIPE"]}' "$f.txt"
}

export TEST PIPE
count "$1" "$WORK/a"
report "$1" "$WORK/a"
if [ $# -ge 2 ]; then
  count "$2" "$WORK/b"
  report "$2" "$WORK/b"
  ta=$(awk '{t+=$2} END {print t}' "$WORK/a.txt"); tb=$(awk '{t+=$2} END {print t}' "$WORK/b.txt")
  ka=$(awk '/kefirdb\/kefir/ {t+=$2} END {print t+0}' "$WORK/a.txt"); kb=$(awk '/kefirdb\/kefir/ {t+=$2} END {print t+0}' "$WORK/b.txt")
  awk -v ta="$ta" -v tb="$tb" -v ka="$ka" -v kb="$kb" 'BEGIN {
    printf "second ÷ first: %.3f (whole process)", tb/ta; if (ka > 0) printf ", %.3f (Kefir code)", kb/ka; print "" }'
  echo "functions that differ by more than 0.2 % of the first's total (instructions per request: first, second):"
  LC_ALL=C join --nocheck-order -a1 -a2 -e0 -o 0,1.2,2.2 "$WORK/a.txt" "$WORK/b.txt" | grep 'kefirdb/kefir' |
    awk -v t="$ta" -v n="$N" '{d=$3-$2; if (d > t/500 || d < -t/500) printf "%+8.0f %8.0f %8.0f  %s\n", d/n, $2/n, $3/n, $1}' | sort -n
fi
