# Shared by the peers scripts (sourced, not run). Delay proxies: with --delay D every
# client and peer port of a system gets a proxy (bench/delaymesh) on port + PROXY_OFFSET (default 20000;
# other benchmarks on this machine use 16xxx) holding each direction for D, and the system's member lists name the proxies, so
# every link — client to server, server to server — crosses one. One mesh process per
# system, started before the servers and stopped after them.

# proxy_port PORT: where the proxy in front of PORT listens.
proxy_port() { echo $(($1 + ${PROXY_OFFSET:-20000})); }

# mesh_start DIR DELAY PORT... : proxies 127.0.0.1:PORT+PROXY_OFFSET -> 127.0.0.1:PORT.
mesh_start() {
  local dir=$1 delay=$2; shift 2
  local bin=${DELAYMESH:-}
  if [ -z "$bin" ]; then
    bin="$dir/delaymesh"
    (cd "$(dirname "${BASH_SOURCE[0]}")/.." && go build -o "$bin" ./delaymesh)
  fi
  local pairs=()
  for p in "$@"; do pairs+=("127.0.0.1:$(proxy_port "$p")=127.0.0.1:$p"); done
  "$bin" -delay "$delay" "${pairs[@]}" >"$dir/delaymesh.log" 2>&1 &
  echo $! >"$dir/delaymesh.pid"
  for _ in $(seq 100); do grep -q '^ready' "$dir/delaymesh.log" 2>/dev/null && return 0; sleep 0.05; done
  echo "delaymesh did not start; see $dir/delaymesh.log" >&2
  return 1
}

mesh_stop() {
  local pidf="$1/delaymesh.pid"
  [ -e "$pidf" ] || return 0
  local pid; pid=$(cat "$pidf")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidf"
}

# delayed DELAY: true if DELAY is a non-zero Go duration.
delayed() { case "$1" in ""|0|0s|0ms|0us|0µs|0ns) return 1 ;; *) return 0 ;; esac; }

# stop_pids DIR GLOB: kill the processes whose pid files match DIR/GLOB and wait for them.
stop_pids() {
  local dir=$1 glob=$2
  for pidf in "$dir"/$glob; do
    [ -e "$pidf" ] || continue
    local pid; pid=$(cat "$pidf")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidf"
  done
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# kefir_groups_up WORK PORT DURABILITY GROUPS: three `kefir server` nodes (WORK/kefir) hosting
# the groups GROUPS (--groups), clients on PORT+101..103, peers PORT+201..203, HTTP PORT+301..303,
# data in WORK/k, pid files WORK/kefir-N.pid; returns once CLUSTER INFO says ok. A CPU-starved
# box needs a longer view-change timeout (bench/peers/kefir.sh); no background maintenance.
# (bench/reshard-vs.sh, bench/rebalance.sh)
kefir_groups_up() {
	local work=$1 port=$2 dur=$3 groups=$4 members="" secret i
	rm -rf "$work/k"; mkdir -p "$work/k"
	for i in 1 2 3; do members+="${members:+,}$i@127.0.0.1:$((port + 200 + i))/127.0.0.1:$((port + 100 + i))"; done
	secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	for i in 1 2 3; do
		KEFIR_CLUSTER_SECRET=$secret "$work/kefir" server --node-id "n$i" --dir "$work/k/n$i" \
			--client-addr "127.0.0.1:$((port + 100 + i))" --peer-addr "127.0.0.1:$((port + 200 + i))" \
			--http-addr "127.0.0.1:$((port + 300 + i))" --members "$members" --replica-id "$i" --cluster-id 4242 \
			--groups "$groups" --bootstrap=true \
			--durability "$dur" --view-change-timeout 2s --compact-interval=-1s --checkpoint-interval=-1s \
			--log-level warn >"$work/k/n$i.log" 2>&1 &
		echo $! >"$work/kefir-$i.pid"
	done
	# A node preallocates its logs at the first start: on a shared disk that can take a while.
	for i in 1 2 3; do
		local n=0
		until listening $((port + 100 + i)); do
			n=$((n + 1)); [ $n -gt 1200 ] && { echo "port $((port + 100 + i)) never listened" >&2; return 1; }
			sleep 0.1
		done
	done
	for _ in $(seq 200); do
		redis-cli -p $((port + 101)) cluster info 2>/dev/null | grep -q 'cluster_state:ok' && return 0
		sleep 0.1
	done
	echo "kefir cluster not ok; see $work/k" >&2; return 1
}
