#!/usr/bin/env bash
# Starts and stops an etcd cluster on loopback for the YCSB comparison (issue 8 §4): N
# members (default 3) with client ports 2479, 2481, ... and peer ports 2480, 2482, ...
# etcd fsyncs its WAL before acknowledging a commit (no knob turns that off in 3.4's
# defaults), so its rows compare with Kefir's sync durability.
#
# --no-maintenance: --snapshot-count 100000000, so no member snapshots its state (and
# compacts its raft log) inside a measured cell; etcd's default is a snapshot every 100000
# applied entries, which the matrix reaches (compare.sh NO_MAINTENANCE).
#
# --delay D puts a delay proxy (bench/delaymesh) on every client and peer port (port +
# PROXY_OFFSET, default 20000): members advertise the proxied peer URLs, so every member-to-member link
# crosses one, and the printed endpoints are the proxied client ports (ycsb -link-delay D).
#
# Usage:
#   bench/peers/etcd.sh start DIR [--members 3] [--port 2479] [--no-maintenance] [--delay 0]
#   bench/peers/etcd.sh stop DIR
#
# Prints the client endpoints (comma-separated) for `go run ./ycsb -db etcd -addr ...`.
# Installs the Debian package etcd-server if missing. Binds 127.0.0.1 only.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,21p' "$0"; exit 2; }
shift 2
members=3; port=2479; delay=0; maint=()
while [ $# -gt 0 ]; do
  case "$1" in
    --members) members=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --no-maintenance) maint=(--snapshot-count 100000000); shift ;;
    --delay) delay=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

stop() { stop_pids "$dir" 'etcd-*.pid'; mesh_stop "$dir"; }

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "unknown command $cmd (start or stop)" >&2; exit 2 ;;
esac

bin=$(command -v etcd || true)
[ -z "$bin" ] && [ -x /usr/bin/etcd ] && bin=/usr/bin/etcd
if [ -z "$bin" ]; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  # To stderr: stdout is the address the caller captures (compare.sh's matrix lines).
  as_root apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends etcd-server >&2
  bin=$(command -v etcd)
fi

mkdir -p "$dir"
# adv PORT: the address others dial for PORT (its proxy under --delay).
adv() { if delayed "$delay"; then echo "127.0.0.1:$(proxy_port "$1")"; else echo "127.0.0.1:$1"; fi; }
if delayed "$delay"; then
  mesh_start "$dir" "$delay" $(seq "$port" $((port + 2 * members - 1)))
fi
cluster=""; endpoints=""
for i in $(seq 0 $((members - 1))); do
  cp=$((port + 2 * i)); pp=$((cp + 1))
  cluster+="${cluster:+,}m$i=http://$(adv "$pp")"
  endpoints+="${endpoints:+,}$(adv "$cp")"
done
for i in $(seq 0 $((members - 1))); do
  cp=$((port + 2 * i)); pp=$((cp + 1))
  # The Debian service unit is not used: members run as plain processes of this script.
  "$bin" --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "http://127.0.0.1:$cp" --advertise-client-urls "http://$(adv "$cp")" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://$(adv "$pp")" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token kefir-bench ${maint[@]+"${maint[@]}"} \
    >"$dir/m$i.log" 2>&1 &
  echo $! >"$dir/etcd-m$i.pid"
done
for _ in $(seq 100); do
  up=0
  for i in $(seq 0 $((members - 1))); do listening $((port + 2 * i)) && up=$((up + 1)); done
  if [ "$up" -eq "$members" ]; then
    echo "$endpoints"; exit 0 # clients wait for the leader election themselves
  fi
  sleep 0.1
done
echo "etcd did not become healthy; see $dir/m*.log" >&2
stop
exit 1
