#!/usr/bin/env bash
# A wiped follower restored from a state larger than one 256 MiB peer frame, with
# three real kefir processes on loopback: N values of 16 MiB are written, the
# third node is SIGKILLed, its directory deleted and the node restarted; the
# script reports how long it took to become a follower again and the views.
#   flock /tmp/kefir-bench.lock bench/bigsnapshot.sh BIN [N]   (default N=22: 352 MiB)
# Needs redis-cli and curl. Ports 16380-16382, 17380-17382, 18380-18382.
set -u
BIN=$1; N=${2:-22}; W=${TMPDIR:-/tmp}/bigsnapshot-$(basename $BIN)
rm -rf $W; mkdir -p $W
members=1@127.0.0.1:17380/127.0.0.1:16380,2@127.0.0.1:17381/127.0.0.1:16381,3@127.0.0.1:17382/127.0.0.1:16382
export KEFIR_CLUSTER_SECRET=a9164dbeb9217a25f1c356c20ff37f18
start() { # i bootstrap
  local i=$1 j=$(( $1 - 1 ))
  $BIN server --node-id n$i --dir $W/n$i --client-addr 127.0.0.1:$((16380+j)) --peer-addr 127.0.0.1:$((17380+j)) \
    --http-addr 127.0.0.1:$((18380+j)) --durability sync --log-level ${LOGLEVEL:-info} --members $members --replica-id $i \
    --cluster-id 4981738797765476809 --bootstrap $2 >>$W/n$i.log 2>&1 &
  echo $! > $W/n$i.pid
}
for i in 1 2 3; do start $i true; done
sleep 2
head -c $((16<<20)) /dev/urandom > $W/val
t0=$(date +%s.%N)
for k in $(seq 1 $N); do redis-cli -p 16380 -x set big$k < $W/val >/dev/null || echo "set $k failed"; done
echo "loaded $N x 16 MiB in $(echo "$(date +%s.%N) - $t0" | bc) s"
sleep 1
echo "after load: views $(for p in 18380 18381 18382; do curl -s http://127.0.0.1:$p/status | grep -o '"view": *[0-9]*' | grep -o '[0-9]*$'; done | tr '\n' ' ')"
kill -9 $(cat $W/n3.pid); sleep 0.5; rm -rf $W/n3
t0=$(date +%s.%N)
start 3 false
ok=0
for s in $(seq 1 120); do
  sleep 0.5
  st=$(curl -s http://127.0.0.1:18382/status)
  [ $((s % 4)) = 0 ] && echo "  t=$((s/2))s n3 $(echo "$st" | grep -o '"role": *"[a-z-]*"') n1 view $(curl -s http://127.0.0.1:18380/status | grep -o '"view": *[0-9]*' | grep -o '[0-9]*$') n2 view $(curl -s http://127.0.0.1:18381/status | grep -o '"view": *[0-9]*' | grep -o '[0-9]*$')"
  if echo "$st" | grep -q '"role": *"follower"'; then ok=1; break; fi
done
dt=$(echo "$(date +%s.%N) - $t0" | bc)
if [ $ok = 1 ]; then echo "n3 restored and normal after $dt s"; else echo "n3 NOT restored after $dt s"; fi
echo "leader: $(curl -s http://127.0.0.1:18380/status | grep -o '"view": *[0-9]*' | tr '\n' ' ')"
grep -c "sent snapshot" $W/n1.log | sed 's/^/n1 "sent snapshot" lines: /'
grep -h "corrupt frame\|view change\|starting view" $W/n*.log | head -3
redis-cli -p 16382 --no-raw get big$N 2>/dev/null | head -c 0
for i in 1 2 3; do kill $(cat $W/n$i.pid) 2>/dev/null; done; sleep 1
du -sh $W 2>/dev/null; rm -rf $W
