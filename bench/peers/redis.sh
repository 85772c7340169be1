#!/usr/bin/env bash
# Starts and stops Redis on loopback for the YCSB comparison (issue 8 §4): a single node, or
# a primary with replicas (drive it with `go run ./ycsb -db redis -redis-wait N`), with its
# durability set to match the Kefir mode it is compared with:
#
#   --fsync always    appendonly yes, appendfsync always: fsync before reply  (≈ kefir sync)
#   --fsync everysec  appendonly yes, appendfsync everysec                     (≈ kefir cad/async)
#   --fsync off       no persistence at all                                    (in-memory baseline)
#
# --no-maintenance turns off the append-only file's automatic rewrite
# (auto-aof-rewrite-percentage 0): a background rewrite forks and copies the data set at
# a moment of Redis's choosing, inside some other system's measured cell of the matrix
# (compare.sh NO_MAINTENANCE). RDB snapshots are off in every mode (--save "").
#
# --delay D puts a delay proxy (bench/delaymesh) on every server's port (port + PROXY_OFFSET, default 20000):
# replicas replicate from the primary's proxy, and the printed endpoint is the primary's
# proxy (ycsb -link-delay D).
#
# Usage:
#   bench/peers/redis.sh start DIR [--port 6399] [--fsync always|everysec|off] [--replicas N] [--no-maintenance] [--delay 0]
#   bench/peers/redis.sh stop DIR
#
# Every server binds 127.0.0.1 only. Installs the Debian package redis-server if missing.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,25p' "$0"; exit 2; }
shift 2
port=6399; fsync=off; replicas=0; delay=0; maint=true
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --fsync) fsync=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --no-maintenance) maint=false; shift ;;
    --delay) delay=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

stop() { stop_pids "$dir" 'redis-*.pid'; mesh_stop "$dir"; }

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "unknown command $cmd (start or stop)" >&2; exit 2 ;;
esac

if ! command -v redis-server >/dev/null; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  # To stderr: stdout is the address the caller captures (compare.sh's matrix lines).
  as_root apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q redis-server >&2
fi

case "$fsync" in
  always|everysec) persist=(--appendonly yes --appendfsync "$fsync" --save "") ;;
  off) persist=(--appendonly no --save "") ;;
  *) echo "--fsync must be always, everysec or off" >&2; exit 2 ;;
esac
[ "$maint" = true ] || persist+=(--auto-aof-rewrite-percentage 0)

mkdir -p "$dir"
adv() { if delayed "$delay"; then proxy_port "$1"; else echo "$1"; fi; }
if delayed "$delay"; then mesh_start "$dir" "$delay" $(seq "$port" $((port + replicas))); fi
start_one() { # port [replicaof-port]
  local p=$1 d="$dir/redis-$1"
  mkdir -p "$d"
  local extra=()
  [ -n "${2:-}" ] && extra=(--replicaof 127.0.0.1 "$2")
  redis-server --bind 127.0.0.1 --port "$p" --protected-mode yes --dir "$d" \
    --daemonize yes --pidfile "$dir/redis-$p.pid" --logfile "$d/redis.log" \
    "${persist[@]}" "${extra[@]}"
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis on port $p did not start; see $d/redis.log" >&2; exit 1
}

start_one "$port"
for i in $(seq 1 "$replicas"); do start_one $((port + i)) "$(adv "$port")"; done
if [ "$replicas" -gt 0 ]; then
  for _ in $(seq 100); do
    n=$(redis-cli -p "$port" info replication | grep -c 'state=online' || true)
    [ "${n:-0}" -ge "$replicas" ] && break; sleep 0.1
  done
fi
echo "127.0.0.1:$(adv "$port")" # the primary (fsync=$fsync, replicas=$replicas, delay=$delay)
