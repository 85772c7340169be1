# Sourced by bench/chain-vs-vr.sh, bench/chain-modes.sh and
# bench/chain-reads.sh (one copy of their flags and of a group's start and
# stop). Set BASE, DUR and ROUNDS to the script's defaults before sourcing
# it. SERVER_FLAGS, if set, is added to every server's flags.
#
#   -p BASE_PORT -d DURATION -r ROUNDS -b KEFIR_BINARY
#   Ports BASE .. BASE+29 are used (clients BASE+0.., peers BASE+10..,
#   the chain master BASE+19, admin BASE+20..).
BIN=
while getopts "p:d:r:b:" o; do
	case $o in
	p) BASE=$OPTARG ;;
	d) DUR=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	b) BIN=$OPTARG ;;
	*) exit 2 ;;
	esac
done
WORK=$(mktemp -d)
trap 'kill $(cat "$WORK"/pids 2>/dev/null) 2>/dev/null || true; rm -rf "$WORK"' EXIT
if [ -z "$BIN" ]; then
	BIN=$WORK/kefir
	go build -o "$BIN" ./cmd/kefir
fi
export KEFIR_CLUSTER_SECRET=bench-secret

# start ENGINE R [MODE]: a group of R nodes (a chain with a standalone
# master, in update mode MODE if given, or a VR group); prints the client
# addresses once the first node answers.
start() {
	local engine=$1 r=$2 mode=${3:-} m="" extra="" modeflag="" addrs=""
	rm -rf "$WORK/data" && mkdir -p "$WORK/data"
	: >"$WORK/pids"
	for i in $(seq 1 "$r"); do
		m="$m${m:+,}$i@127.0.0.1:$((BASE + 9 + i))/127.0.0.1:$((BASE + i - 1))"
		addrs="$addrs${addrs:+,}127.0.0.1:$((BASE + i - 1))"
	done
	if [ -n "$mode" ]; then
		modeflag="--chain-mode $mode"
	fi
	if [ "$engine" = chain ]; then
		# shellcheck disable=SC2086
		"$BIN" chain-master --id 9 --peer-addr "127.0.0.1:$((BASE + 19))" --members "$m" --cluster-id 77 $modeflag \
			>"$WORK/data/master.log" 2>&1 &
		echo $! >>"$WORK/pids"
		extra="--engine chain --chain-master 9@127.0.0.1:$((BASE + 19)) $modeflag"
	fi
	for i in $(seq 1 "$r"); do
		# shellcheck disable=SC2086
		"$BIN" server --node-id "n$i" --dir "$WORK/data/n$i" --client-addr "127.0.0.1:$((BASE + i - 1))" \
			--peer-addr "127.0.0.1:$((BASE + 9 + i))" --http-addr "127.0.0.1:$((BASE + 19 + i))" \
			--members "$m" --replica-id "$i" --cluster-id 77 --bootstrap true --log-level warn $extra ${SERVER_FLAGS:-} \
			>"$WORK/data/n$i.log" 2>&1 &
		echo $! >>"$WORK/pids"
	done
	for _ in $(seq 1 100); do
		redis-cli -p "$BASE" set warmup 1 >/dev/null 2>&1 && break
		sleep 0.1
	done
	echo "$addrs"
}

stop() {
	kill $(cat "$WORK/pids") 2>/dev/null || true
	sleep 1
}
