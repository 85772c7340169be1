package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Issue 28, first part (docs/cluster.md): three real nodes host three
// 3-replica groups on the static slot map kefir up --groups 3 lays out.
// redis-cli -c sets and gets keys of every group from one node, following
// -MOVED; plain redis-cli gets the same values from every node (forwarded);
// a multi-key command across slots is refused with Redis's CROSSSLOT, and
// one whose keys share a hash tag runs.
func TestGroupsRedisCliCluster(t *testing.T) {
	g := cluster.StartGroups(t, 3, threeGroups)
	g.WaitLeaders(20 * time.Second)
	first := g.Nodes[0].ClientAddr
	groupsSeen := map[kcluster.GroupID]bool{}
	for i := range 12 {
		k := "key" + strconv.Itoa(i)
		groupsSeen[kcluster.EvenGroups(3, []uint64{1, 2, 3}, 3)[groupIndex(kcluster.Slot([]byte(k)))].ID] = true
		if out := redisCLIWrite(t, first, "-c", "set", k, "v"+strconv.Itoa(i)); out != "OK" {
			t.Fatalf("redis-cli -c set %s = %q", k, out)
		}
	}
	if len(groupsSeen) != 3 {
		t.Fatalf("the keys reached groups %v, want all three", groupsSeen)
	}
	for i := range 12 {
		k := "key" + strconv.Itoa(i)
		if out := redisCLI(t, first, "-c", "get", k); out != "v"+strconv.Itoa(i) {
			t.Fatalf("redis-cli -c get %s = %q", k, out)
		}
		// A plain client: the node forwards to the group's leader.
		n := g.Nodes[i%3].ClientAddr
		if v, err := cluster.Command(n, "GET", k); err != nil || string(v.Str) != "v"+strconv.Itoa(i) {
			t.Fatalf("GET %s at %s = %q, %v", k, n, v.Str, err)
		}
	}
	if out := redisCLI(t, first, "-c", "mset", "a", "1", "b", "2"); !strings.Contains(out, "CROSSSLOT Keys in request don't hash to the same slot") {
		t.Fatalf("mset across slots = %q", out)
	}
	if out := redisCLI(t, first, "-c", "mset", "{u}a", "1", "{u}b", "2"); out != "OK" {
		t.Fatalf("mset with a hash tag = %q", out)
	}
	if out := redisCLI(t, first, "-c", "mget", "{u}a", "{u}b"); out != "1\n2" {
		t.Fatalf("mget with a hash tag = %q", out)
	}
	// Ops whose arguments are not keys route by their key alone: a hash's
	// fields, a script's arguments (these were refused CROSSSLOT).
	for i := range 3 {
		h := "hash" + strconv.Itoa(i)
		if out := redisCLI(t, first, "-c", "hset", h, "f1", "a", "f2", "b", "f3", "c"); out != "3" {
			t.Fatalf("redis-cli -c hset %s of three fields = %q", h, out)
		}
		if out := redisCLI(t, first, "-c", "hmget", h, "f1", "f3"); out != "a\nc" {
			t.Fatalf("redis-cli -c hmget %s = %q", h, out)
		}
		if out := redisCLI(t, first, "-c", "eval", "return redis.call('hget', KEYS[1], ARGV[1]) .. ARGV[2]", "1", h, "f2", "zz"); out != "bzz" {
			t.Fatalf("redis-cli -c eval over %s = %q", h, out)
		}
	}
	// A script runs in its declared keys' group and may touch only them:
	// an undeclared key may be another group's (it was written into the
	// wrong group).
	if out := redisCLI(t, first, "-c", "eval", "return redis.call('set', ARGV[1], 'x')", "0", "undeclared"); !strings.Contains(out, "did not declare") {
		t.Fatalf("eval writing an undeclared key = %q, want the undeclared-key error", out)
	}
	if out := redisCLI(t, first, "cluster", "keyslot", "{u}a"); out != strconv.Itoa(int(kcluster.Slot([]byte("u")))) {
		t.Fatalf("cluster keyslot = %q", out)
	}
	uslot := strconv.Itoa(int(kcluster.Slot([]byte("u"))))
	for _, n := range g.Nodes { // the leader of {u}'s group counts; the others forward to it
		if out := redisCLI(t, n.ClientAddr, "cluster", "countkeysinslot", uslot); out != "2" {
			t.Fatalf("cluster countkeysinslot %s at %s = %q", uslot, n.ID, out)
		}
		if out := redisCLI(t, n.ClientAddr, "cluster", "getkeysinslot", uslot, "10"); out != "{u}a\n{u}b" {
			t.Fatalf("cluster getkeysinslot %s at %s = %q", uslot, n.ID, out)
		}
	}
	// CLUSTER SHARDS and NODES in redis-server 7.0.15's shapes (recorded
	// from a 3-master cluster: the same keys in the same order, one shard
	// per group with its leader as the master).
	shards, err := cluster.Command(first, "CLUSTER", "SHARDS")
	if err != nil || len(shards.Elems) != 3 {
		t.Fatalf("CLUSTER SHARDS = %v, %v", shards, err)
	}
	for _, sh := range shards.Elems {
		if len(sh.Elems) != 4 || string(sh.Elems[0].Str) != "slots" || string(sh.Elems[2].Str) != "nodes" || len(sh.Elems[1].Elems) != 2 || len(sh.Elems[3].Elems) != 3 {
			t.Fatalf("CLUSTER SHARDS shard = %v", sh)
		}
		var keys []string
		roles := ""
		for i, f := range sh.Elems[3].Elems[0].Elems {
			if i%2 == 0 {
				keys = append(keys, string(f.Str))
			} else if keys[len(keys)-1] == "role" {
				roles = string(f.Str)
			}
		}
		if strings.Join(keys, " ") != "id port ip endpoint role replication-offset health" || roles != "master" {
			t.Fatalf("CLUSTER SHARDS node keys %v, first node's role %q", keys, roles)
		}
	}
	nodes := redisCLI(t, first, "cluster", "nodes")
	masters := 0
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || len(f[0]) != 40 || f[7] != "connected" {
			t.Fatalf("CLUSTER NODES line %q", line)
		}
		if strings.Contains(f[2], "master") {
			masters++
		}
	}
	if masters == 0 || !strings.Contains(nodes, "myself,") {
		t.Fatalf("CLUSTER NODES:\n%s", nodes)
	}
	if info := redisCLI(t, first, "cluster", "info"); !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_size:3") {
		t.Fatalf("CLUSTER INFO:\n%s", info)
	}
	if id := redisCLI(t, first, "cluster", "myid"); !strings.HasPrefix(nodes, id) && !strings.Contains(nodes, "\n"+id) {
		t.Fatalf("CLUSTER MYID %s is not in CLUSTER NODES", id)
	}

	// /status shows the map: each group's slots, leader and this node's
	// replica of it.
	var st struct {
		Groups []struct {
			ID        uint64 `json:"id"`
			SlotCount int    `json:"slot_count"`
			Leader    uint64 `json:"leader"`
			Role      string `json:"role"`
		} `json:"groups"`
	}
	hr, err := http.Get("http://" + g.Nodes[0].HTTPAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(hr.Body).Decode(&st)
	hr.Body.Close()
	slots := 0
	for _, gs := range st.Groups {
		slots += gs.SlotCount
		if gs.Leader == 0 || gs.Role == "" {
			t.Errorf("/status group %+v: no leader or no local role", gs)
		}
	}
	if err != nil || len(st.Groups) != 3 || slots != kcluster.Slots {
		t.Fatalf("/status groups %+v (%d slots), %v", st.Groups, slots, err)
	}

	// A connection that asked for the topology is a cluster client's: a
	// request for a slot led elsewhere gets Redis Cluster's -MOVED. (On a
	// loaded box a group may change leaders meanwhile: the check is
	// repeated until one round saw one leader throughout.)
	k := "key0"
	slot := int(kcluster.Slot([]byte(k)))
	var replies []resp.Value
	want := ""
	testgroup.Until(10*time.Second, 100*time.Millisecond, func() bool {
		leader := g.SlotLeader(slot)
		if leader < 0 {
			return false
		}
		other := g.Nodes[(leader+1)%3]
		replies = pipeline(t, other.ClientAddr, []string{"GET", k}, []string{"CLUSTER", "SLOTS"}, []string{"GET", k})
		want = fmt.Sprintf("MOVED %d %s", slot, g.Nodes[leader].ClientAddr)
		return string(replies[0].Str) == "v0" && string(replies[2].Str) == want && g.SlotLeader(slot) == leader
	})
	if string(replies[0].Str) != "v0" {
		t.Fatalf("GET %s at a follower before CLUSTER SLOTS = %q (want it forwarded)", k, replies[0].Str)
	}
	if string(replies[2].Str) != want {
		t.Fatalf("GET %s at a follower after CLUSTER SLOTS = %q, want %q", k, replies[2].Str, want)
	}
	// Every node holds every group's keys once its replicas applied them:
	// 12 + 2 strings and 3 hashes (their rows and markers are not keys).
	const keys = 3 * 17
	dbsizeReaches := func(timeout, every time.Duration) int {
		total := 0
		testgroup.Until(timeout, every, func() bool {
			total = 0
			for _, n := range g.Nodes {
				v, _ := cluster.Command(n.ClientAddr, "DBSIZE")
				total += int(v.Int)
			}
			return total == keys
		})
		return total
	}
	if total := dbsizeReaches(5*time.Second, 50*time.Millisecond); total != keys {
		t.Fatalf("DBSIZE over the nodes = %d, want %d", total, keys)
	}
	// Active expiry runs at each group's leader over that group's keys:
	// keys of every group set to expire are deleted (DBSIZE counts an
	// expired key until it is deleted).
	for i := range 12 {
		if v, err := cluster.Command(first, "SET", "ttl"+strconv.Itoa(i), "x", "PX", "200"); err != nil || string(v.Str) != "OK" {
			t.Fatalf("SET ttl%d PX 200 = %q, %v", i, v.Str, err)
		}
	}
	if total := dbsizeReaches(10*time.Second, 100*time.Millisecond); total != keys {
		t.Fatalf("DBSIZE over the nodes %d after the keys expired, want %d: active expiry missed a group", total, keys)
	}
	// FLUSHALL from plain redis-cli at one node empties every group (one
	// flush per group, most of them forwarded to their leaders).
	if out := redisCLI(t, g.Nodes[1].ClientAddr, "flushall"); out != "OK" {
		t.Fatalf("redis-cli flushall at a node of three groups = %q", out)
	}
	for i := range 12 {
		k := "key" + strconv.Itoa(i)
		if v, err := cluster.Command(first, "GET", k); err != nil || v.Kind != resp.Null {
			t.Fatalf("GET %s after FLUSHALL = %q (%v), %v", k, v.Str, v.Kind, err)
		}
	}
	if out := redisCLI(t, first, "-c", "mget", "{u}a", "{u}b"); out != "" {
		t.Fatalf("mget after FLUSHALL = %q", out)
	}
}

// pipeline sends cmds on one connection and returns their replies.
func pipeline(t *testing.T, addr string, cmds ...[]string) []resp.Value {
	t.Helper()
	out, err := pipelineErr(addr, cmds...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pipelineErr is pipeline without failing the test: a connection the node
// closes (a write in flight when its group's leader changed: the outcome
// unknown) is an error to retry on.
func pipelineErr(addr string, cmds ...[]string) ([]resp.Value, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	var b []byte
	for _, c := range cmds {
		args := make([][]byte, len(c))
		for i, a := range c {
			args[i] = []byte(a)
		}
		b = resp.AppendCommand(b, args...)
	}
	if _, err := nc.Write(b); err != nil {
		return nil, err
	}
	rd := resp.NewReader(nc, 0)
	out := make([]resp.Value, len(cmds))
	for i := range cmds {
		if out[i], err = rd.ReadValue(); err != nil {
			return nil, fmt.Errorf("reply %d from %s: %w", i, addr, err)
		}
	}
	return out, nil
}

// threeGroups is kefir up --groups 3's layout: three 3-replica groups on
// three nodes, the slots split evenly.
var threeGroups = kcluster.FormatGroups(kcluster.EvenGroups(3, []uint64{1, 2, 3}, 3))

// groupIndex is the index of the group owning slot in EvenGroups(3, ...).
func groupIndex(slot uint16) int {
	for i, g := range kcluster.EvenGroups(3, []uint64{1, 2, 3}, 3) {
		if slot >= g.Slots[0].Start && slot <= g.Slots[0].End {
			return i
		}
	}
	return -1
}

// redisPyWorkload runs redis-py's RedisCluster, unmodified, against the
// cluster for a while: SET, GET and MGET of keys with hash tags over every
// group, checking each read against the last value written. An operation
// that meets a dead node (ConnectionError: the client re-reads the topology)
// or a cluster without a leader for a slot yet is retried for up to 20 s,
// as an application does; -MOVED is followed by the client itself.
//
// redis-py 4.3.4's NodesManager.initialize deep-copies its connection
// arguments, which hold the client's own bound on_connect, and so fails
// ("cannot pickle '_thread.lock' object") whenever it re-reads the topology
// after it dropped a dead node's connection — against Redis Cluster too. On
// that RedisClusterException the workload makes a new client, as an
// application must with this version.
const redisPyWorkload = `
import sys, time, logging
logging.disable(logging.CRITICAL)
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError, ClusterDownError, TimeoutError, RedisClusterException, ResponseError
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def connect():
    return RedisCluster(host=host, port=port, socket_timeout=5)
rc = connect()
retries = 0
def retry(f):
    global rc, retries
    deadline = time.time() + 20
    while True:
        try:
            return f()
        except (ConnectionError, ClusterDownError, TimeoutError, RedisClusterException, ResponseError) as e:
            if isinstance(e, ResponseError) and "UNAVAILABLE" not in str(e):
                raise
            if time.time() > deadline:
                raise
            retries += 1
            time.sleep(0.1)
            if isinstance(e, RedisClusterException):
                try:
                    rc = connect()
                except Exception:
                    pass
last, i, end = {}, 0, time.time() + secs
while time.time() < end:
    tag = "t%d" % (i % 12)
    k1, k2 = "{%s}a" % tag, "{%s}b" % tag
    retry(lambda: rc.mset({k1: "a%d" % i, k2: "b%d" % i}))
    last[k1], last[k2] = "a%d" % i, "b%d" % i
    got = retry(lambda: rc.mget(k1, k2))
    if [x.decode() for x in got] != [last[k1], last[k2]]:
        print("MISMATCH mget", k1, k2, got, last[k1], last[k2]); sys.exit(1)
    k = "plain%d" % (i % 50)
    retry(lambda: rc.set(k, str(i)))
    if retry(lambda: rc.get(k)).decode() != str(i):
        print("MISMATCH get", k); sys.exit(1)
    i += 1
print("OK", i, "ops, retries", retries)
`

// redis-py's RedisCluster works unmodified (it checks INFO's
// cluster_enabled, reads CLUSTER SLOTS, hashes keys itself and follows
// -MOVED: the nodes redirect every client, --cluster-redirects), also while
// the leader of one group is killed and restarted under it.
func TestGroupsRedisPyClusterLeaderKill(t *testing.T) {
	g := cluster.StartGroups(t, 3, threeGroups, "--cluster-redirects", "true")
	g.WaitLeaders(20 * time.Second)
	if out, err := exec.Command("/usr/bin/python3", "-c", "import redis.cluster").CombinedOutput(); err != nil {
		t.Fatalf("redis-py not found (%v: %s): install Debian's python3-redis (apt-get install python3-redis; .ci/run does); the e2e suite needs it", err, out)
	}
	host, port := "127.0.0.1", g.Nodes[0].Port()
	cmd := exec.Command("/usr/bin/python3", "-c", redisPyWorkload, host, port, "6")
	out := make(chan string, 1)
	go func() {
		// stdout alone is the verdict: redis-py may print to stderr from a
		// destructor ("Exception ignored in: ClusterNode.__del__ ...
		// no attribute 'redis_connection'", a node object whose connection
		// to the killed node was never made), which is not the workload's.
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil || !bytes.HasPrefix(b, []byte("OK ")) {
			b = append(b, stderr.Bytes()...)
		}
		out <- fmt.Sprintf("%s (exit: %v)", b, err)
	}()
	time.Sleep(1500 * time.Millisecond)
	victim := g.SlotLeader(int(kcluster.Slot([]byte("t1"))))
	if victim < 0 {
		t.Fatal("no leader known for the slot of {t1}")
	}
	g.Nodes[victim].Kill()
	time.Sleep(2 * time.Second)
	g.Nodes[victim].Start()
	res := <-out
	if !strings.HasPrefix(res, "OK ") || !strings.HasSuffix(res, "(exit: <nil>)") {
		t.Fatalf("redis-py workload: %s", res)
	}
	t.Logf("redis-py RedisCluster: %s; killed and restarted %s, the leader of {t1}'s group", strings.TrimSpace(res), g.Nodes[victim].ID)
	// With --cluster-redirects plain redis-cli sees the redirect at a
	// follower, and redis-cli -c follows it.
	g.WaitLeaders(20 * time.Second)
	k := "{t1}a"
	var follower, moved string
	testgroup.Until(10*time.Second, 100*time.Millisecond, func() bool { // leaders may move on a loaded box
		follower = g.Nodes[(g.SlotLeader(int(kcluster.Slot([]byte(k))))+1)%3].ClientAddr
		moved = redisCLI(t, follower, "get", k)
		return strings.HasPrefix(moved, "MOVED ")
	})
	if !strings.HasPrefix(moved, "MOVED ") {
		t.Fatalf("redis-cli get %s at a follower = %q, want MOVED", k, moved)
	}
	if out := redisCLI(t, follower, "-c", "get", k); !strings.HasPrefix(out, "a") {
		t.Fatalf("redis-cli -c get %s at a follower = %q", k, out)
	}
}

// kefir up --groups 3 starts three nodes hosting three groups (the banner
// says so); redis-cli -c writes and reads keys of every group through every
// node.
func TestUpGroups(t *testing.T) {
	base := freeBase(t, 3)
	a := upAddrsOf(base, 3)
	u := startUp(t, "--dir", t.TempDir(), "--base-port", strconv.Itoa(base), "--groups", "3")
	if !strings.Contains(u.banner, "3 nodes hosting 3 3-replica groups") {
		t.Fatalf("banner:\n%s", u.banner)
	}
	for i := range 12 {
		if out := redisCLI(t, a.client[i%3], "-c", "set", fmt.Sprintf("up%d", i), strconv.Itoa(i)); out != "OK" {
			t.Fatalf("set up%d: %q", i, out)
		}
	}
	for i := range 12 {
		if out := redisCLI(t, a.client[(i+1)%3], "-c", "get", fmt.Sprintf("up%d", i)); out != strconv.Itoa(i) {
			t.Fatalf("get up%d = %q", i, out)
		}
	}
	if v, err := cluster.Command(a.client[0], "CLUSTER", "SHARDS"); err != nil || len(v.Elems) != 3 {
		t.Fatalf("CLUSTER SHARDS: %v, %v", v, err)
	}
	u.stop(t)
}

// kefir up --groups 3 --nodes 5 places each 3-replica group on three of
// the five nodes: no node hosts every group, and the nodes' groups have
// different leaders. It comes up (before, up compared every node's first
// group's view and leader, which never agree here, and gave up after 45 s);
// redis-cli -c writes and reads keys of every group through every node;
// at every node redis-cli --scan and KEYS return every key once and DBSIZE
// counts them all (the groups a node does not host are read at their
// leaders: KEFIR.GROUPSCAN); redis-py's RedisCluster scan_iter, keys and
// dbsize see the whole keyspace.
func TestUpGroupsOnMoreNodesThanAGroupHas(t *testing.T) {
	base := freeBase(t, 5)
	a := upAddrsOf(base, 5)
	u := startUp(t, "--dir", t.TempDir(), "--base-port", strconv.Itoa(base), "--groups", "3", "--nodes", "5")
	if !strings.Contains(u.banner, "5 nodes hosting 3 3-replica groups") {
		t.Fatalf("banner:\n%s", u.banner)
	}
	const n = 60
	for i := range n {
		if out := redisCLI(t, a.client[i%5], "-c", "set", fmt.Sprintf("up%d", i), strconv.Itoa(i)); out != "OK" {
			t.Fatalf("set up%d: %q", i, out)
		}
	}
	for i := range n {
		if out := redisCLI(t, a.client[(i+2)%5], "-c", "get", fmt.Sprintf("up%d", i)); out != strconv.Itoa(i) {
			t.Fatalf("get up%d = %q", i, out)
		}
	}
	for _, addr := range a.client {
		for name, out := range map[string]string{
			"redis-cli --scan": redisCLI(t, addr, "--scan", "--pattern", "up*"),
			"KEYS up*":         redisCLI(t, addr, "keys", "up*"),
		} {
			keys := strings.Fields(out)
			slices.Sort(keys)
			if len(keys) != n || len(slices.Compact(keys)) != n {
				t.Fatalf("%s at %s: %d keys, want each of %d once:\n%s", name, addr, len(keys), n, out)
			}
		}
		if out := redisCLI(t, addr, "dbsize"); out != strconv.Itoa(n) {
			t.Fatalf("DBSIZE at %s = %q, want %d", addr, out, n)
		}
	}
	py := pythonWithRedis()
	if py == "" {
		t.Fatal("no python3 with redis-py: install Debian's python3-redis")
	}
	host, port, _ := net.SplitHostPort(a.client[3])
	script := `import sys
from redis.cluster import RedisCluster
rc = RedisCluster(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=30)
ks = list(rc.scan_iter(match="up*", count=7))
print(len(ks), len(set(ks)), len(rc.keys("up*")), rc.dbsize())
`
	out, err := exec.Command(py, "-c", script, host, port).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != fmt.Sprintf("%d %d %d %d", n, n, n, n) {
		t.Fatalf("redis-py RedisCluster scan_iter, keys, dbsize at node 4: %v\n%s", err, out)
	}
	u.stop(t)
}
