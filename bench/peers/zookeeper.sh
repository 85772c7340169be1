#!/usr/bin/env bash
# Starts and stops a ZooKeeper ensemble on loopback for the YCSB comparison (issue 8 §4):
# N servers (default 3), client ports PORT.. (2181, 2182, 2183), quorum ports PORT+100..,
# leader-election ports PORT+200.., each server a plain JVM process of this script (the
# Debian service unit is not used).
#
#   --force-sync yes   every server fsyncs its transaction log before acknowledging a
#                      proposal (ZooKeeper's default): compare with Kefir sync
#   --force-sync no    the log is written but not fsynced: compare with Kefir cad/async
#   --no-maintenance   snapCount=100000000 and no autopurge: no server snapshots its data
#                      tree (default every 100000 transactions, randomised) or purges old
#                      files inside a measured cell of the matrix (compare.sh NO_MAINTENANCE)
#   --delay D          a delay proxy (bench/delaymesh) on every client, quorum and election
#                      port: each server's own zoo.cfg names its own ports and the others'
#                      proxies, so every server-to-server link crosses one; clients get
#                      the proxied client ports. Drive with ycsb -link-delay D.
#
# Usage:
#   bench/peers/zookeeper.sh start DIR [--servers 3] [--port 2181] [--force-sync yes|no] [--no-maintenance] [--delay 0]
#   bench/peers/zookeeper.sh stop DIR
#
# Prints the client endpoints (comma-separated) for `go run ./ycsb -db zookeeper -addr ...`.
# Installs the Debian package zookeeper if missing (apt-get update first). It depends on
# default-jre (OpenJDK 17 on Debian 12: openjdk-17-jre-headless is a 44 MB download, 189 MB
# installed) and libzookeeper-java; measured here with OpenJDK 17 already present: 45
# packages, 32.5 MB fetched, 9.5 s including apt-get update. Without a JRE it takes the
# JRE's download and unpacking on top (not measured on this machine).
# Binds 127.0.0.1 only.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,28p' "$0"; exit 2; }
shift 2
servers=3; port=2181; force=yes; delay=0; maint=true
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) servers=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --force-sync) force=$2; shift 2 ;;
    --no-maintenance) maint=false; shift ;;
    --delay) delay=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$force" in yes|no) ;; *) echo "--force-sync must be yes or no" >&2; exit 2 ;; esac

stop() { stop_pids "$dir" 'zk-*.pid'; mesh_stop "$dir"; }

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "unknown command $cmd (start or stop)" >&2; exit 2 ;;
esac

jar=/usr/share/java/zookeeper.jar
if [ ! -e "$jar" ] || ! command -v java >/dev/null; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  # To stderr: stdout is the address the caller captures (compare.sh's matrix lines).
  as_root apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends zookeeper >&2
fi

mkdir -p "$dir"
cport() { echo $((port + $1 - 1)); }
qport() { echo $((port + 100 + $1 - 1)); }
eport() { echo $((port + 200 + $1 - 1)); }
endpoints=""
if delayed "$delay"; then
  ports=()
  for i in $(seq "$servers"); do ports+=("$(cport "$i")" "$(qport "$i")" "$(eport "$i")"); done
  mesh_start "$dir" "$delay" "${ports[@]}"
fi
for i in $(seq "$servers"); do
  d="$dir/zk$i"; mkdir -p "$d/data"
  echo "$i" >"$d/data/myid"
  {
    echo "tickTime=200"        # 200 ms ticks: elections and session checks in well under a second
    echo "initLimit=50"
    echo "syncLimit=25"
    echo "dataDir=$d/data"
    echo "clientPort=$(cport "$i")"
    echo "clientPortAddress=127.0.0.1"
    echo "admin.enableServer=false" # no Jetty admin server on :8080
    echo "forceSync=$force"
    echo "maxClientCnxns=0"
    if [ "$maint" = true ]; then
      echo "autopurge.purgeInterval=1"
    else
      echo "snapCount=100000000"
    fi
    if [ "$servers" -gt 1 ]; then
      for j in $(seq "$servers"); do
        if [ "$j" = "$i" ] || ! delayed "$delay"; then
          echo "server.$j=127.0.0.1:$(qport "$j"):$(eport "$j")"
        else
          echo "server.$j=127.0.0.1:$(proxy_port "$(qport "$j")"):$(proxy_port "$(eport "$j")")"
        fi
      done
    fi
  } >"$d/zoo.cfg"
  java -Xms256m -Xmx512m -XX:+UseG1GC -Dzookeeper.log.dir="$d" -cp "$jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" >"$d/zk.log" 2>&1 &
  echo $! >"$dir/zk-$i.pid"
  p=$(cport "$i")
  delayed "$delay" && p=$(proxy_port "$p")
  endpoints+="${endpoints:+,}127.0.0.1:$p"
done
for _ in $(seq 300); do
  up=0
  for i in $(seq "$servers"); do listening "$(cport "$i")" && up=$((up + 1)); done
  if [ "$up" -eq "$servers" ]; then
    echo "$endpoints"; exit 0 # clients wait for a quorum (a session) themselves
  fi
  sleep 0.1
done
echo "zookeeper did not start; see $dir/zk*/zk.log" >&2
stop
exit 1
