package server

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/vrshard"
)

type group struct {
	cfgs  []Config
	nodes []*Server
}

// startGroup starts a 3-replica group in-process, each node with its own
// ports and directory, bootstrapped.
func startGroup(t testing.TB) *group { return startGroupWith(t, nil) }

// startGroupWith is startGroup with mod applied to every node's Config.
//
// The member list must name every port before any node binds one, so the
// ports come from testgroup.LoopbackAddrs (listen, close) and another test or process may
// take one in between: a start that fails with EADDRINUSE closes what it
// started and tries again with fresh ports.
func startGroupWith(t testing.TB, mod func(*Config)) *group {
	t.Helper()
	for attempt := 1; ; attempt++ {
		g, err := tryStartGroup(t, mod)
		if err == nil {
			return g
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			t.Fatalf("start group (attempt %d): %v", attempt, err)
		}
		t.Logf("start group: %v; retrying with fresh ports", err)
	}
}

func tryStartGroup(t testing.TB, mod func(*Config)) (*group, error) {
	addrs := testgroup.LoopbackAddrs(t, 6)
	var ms []Member
	for i := range 3 {
		ms = append(ms, Member{ID: uint64(i + 1), PeerAddr: addrs[2*i], ClientAddr: addrs[2*i+1]})
	}
	g := &group{}
	for i, m := range ms {
		cfg := Config{
			NodeID: "n" + string(rune('1'+i)), ClientAddr: m.ClientAddr, PeerAddr: m.PeerAddr,
			HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), ClusterSecret: "s3cret",
			Members: ms, ReplicaID: m.ID, ClusterID: 42, Bootstrap: true,
			Logger: slog.New(slog.DiscardHandler), OpenReplica: vrshard.OpenHosted,
		}
		if mod != nil {
			mod(&cfg)
		}
		s, err := startNode(cfg)
		if err != nil {
			for _, n := range g.nodes {
				n.Close()
			}
			return nil, fmt.Errorf("node %d: %w", i+1, err)
		}
		t.Cleanup(func() { s.Close() })
		g.cfgs = append(g.cfgs, cfg)
		g.nodes = append(g.nodes, s)
	}
	return g, nil
}

// vrOf is a replica node's VR replica, for tests that look into the engine
// (the front door itself knows only shard.Replica and cluster.Group).
func vrOf(s *Server) *vrshard.Replica { return s.shard.(*vrshard.Replica) }

// groupsConfigs are the configurations of n nodes (ids 1..n) of a
// cluster of groups (chains: those of groups that are chain groups), each
// bootstrapping, logging by testLogger.
func groupsConfigs(t testing.TB, n int, groups []cluster.GroupSpec, chains ...cluster.GroupID) []Config {
	addrs := testgroup.LoopbackAddrs(t, 2*n)
	var ms []Member
	for i := range n {
		ms = append(ms, Member{ID: uint64(i + 1), PeerAddr: addrs[2*i], ClientAddr: addrs[2*i+1]})
	}
	cfgs := make([]Config, n)
	for i, m := range ms {
		cfgs[i] = Config{
			NodeID: fmt.Sprint("n", m.ID), ClientAddr: m.ClientAddr, PeerAddr: m.PeerAddr,
			HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), ClusterSecret: "s3cret",
			Members: ms, ReplicaID: m.ID, ClusterID: 42, Bootstrap: true,
			Logger: testLogger(m.ID), OpenReplica: vrshard.OpenHosted,
			OpenChainReplica: vrshard.OpenChainGroup(vrshard.ChainStoreOptions{}),
			Groups:           groups, ChainGroups: chains,
		}
	}
	return cfgs
}

// startConfig starts a node of cfg, closed at the test's end.
func startConfig(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := startNode(cfg)
	if err != nil {
		t.Fatalf("node %d: %v", cfg.ReplicaID, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startConfigs starts a node of each of cfgs (startConfig).
func startConfigs(t testing.TB, cfgs []Config) []*Server {
	t.Helper()
	nodes := make([]*Server, len(cfgs))
	for i, cfg := range cfgs {
		nodes[i] = startConfig(t, cfg)
	}
	return nodes
}

func startNode(cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("New: %w", err)
	}
	if err := s.Start(); err != nil {
		s.Close()
		return nil, fmt.Errorf("Start: %w", err)
	}
	return s, nil
}

func (g *group) start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := startNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// settleTime is how long every running node must agree on one leader, and
// hear it, before leader trusts it: longer than the default view-change
// timeout (300 ms), so a follower that was not hearing the leader has
// started a view change by then and broken the agreement.
const settleTime = 500 * time.Millisecond

// deafAfter: a follower that received nothing from the leader for this long
// is not hearing its heartbeats (every 10 ms); the group is not ready.
const deafAfter = 200 * time.Millisecond

// leader waits until the group is ready and returns the leader's index:
// every running node is in normal status in the same view and names the
// same leader, which says it leads, every follower keeps receiving the
// leader's messages, and that has held for settleTime. A node that merely
// calls itself leader is not enough: a bootstrapped group's first leader
// does so before it has reached anyone, and a peer that was not listening
// yet when the leader first dialed it may hear nothing for a while (dial
// backoff, a loaded box), time out and start a view change; a client that
// writes through a node in a view change gets -UNAVAILABLE no leader, which
// is the contract during an election, not a failure of the test's subject.
func (g *group) leader(t testing.TB) int {
	t.Helper()
	heard := make([]uint64, len(g.nodes))
	heardAt := make([]time.Time, len(g.nodes))
	l, ok := testgroup.Settled(20*time.Second, settleTime, 10*time.Millisecond, func() (int, bool) {
		now := time.Now()
		l, ok := g.agreedLeader()
		if !ok {
			return -1, false
		}
		lid := g.cfgs[l].ReplicaID
		for i, s := range g.nodes {
			if s == nil || i == l {
				continue
			}
			if n := receivedFrom(s, lid); n != heard[i] {
				heard[i], heardAt[i] = n, now
			}
			if now.Sub(heardAt[i]) > deafAfter {
				ok = false
			}
		}
		return l, ok
	})
	if ok {
		return l
	}
	for i, s := range g.nodes {
		if s != nil {
			t.Logf("node %d: %+v", i, vrOf(s).Info())
		}
	}
	t.Fatal("the group did not settle on a leader within 20s")
	return -1
}

// receivedFrom is how many messages s's transport has received from peer.
func receivedFrom(s *Server, peer uint64) uint64 {
	for _, l := range vrOf(s).Transport().Stats().Links {
		if l.Peer == peer {
			return l.Received
		}
	}
	return 0
}

// agreedLeader reports the index of the leader every running node agrees on.
func (g *group) agreedLeader() (int, bool) {
	l := -1
	var view, id uint64
	for i, s := range g.nodes {
		if s == nil {
			continue
		}
		in := vrOf(s).Info()
		if in.Status != vr.Normal || in.Leader == 0 || in.Failed != nil {
			return -1, false
		}
		if id == 0 {
			view, id = in.View, in.Leader
		} else if in.View != view || in.Leader != id {
			return -1, false
		}
		if in.IsLeader {
			l = i
		}
	}
	return l, l >= 0
}

func TestReplicatedWritesAndReadsThroughAnyNode(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	f := (l + 1) % 3
	// A replica serves reads through ReadDeferred, not the single node's GET path.
	if n := g.nodes[l]; !n.reads.Deferred || n.reads.Key {
		t.Fatalf("replica: read paths %+v; want deferred reads and no ReadKey", n.reads)
	}

	// A follower forwards a plain write and a linearizable read to the leader.
	fc := dial(t, g.nodes[f])
	fc.expect(`
SET k1 v1 => OK
GET k1 => "v1"
INCR n => (integer) 1
`)
	// The leader has it.
	lc := dial(t, g.nodes[l])
	lc.expect(`GET k1 => "v1"`)

	// A request asking for redirects gets -MOVED to the leader's client port.
	got := fc.do("KEFIR.CALL", "REDIRECT", "CMD", "SET", "k2", "v2")
	if want := "MOVED " + g.cfgs[l].ClientAddr; got != want {
		t.Fatalf("redirect: got %q, want %q", got, want)
	}
	got = fc.do("KEFIR.CALL", "REDIRECT", "CMD", "GET", "k1")
	if !strings.HasPrefix(got, "MOVED ") {
		t.Fatalf("redirected linearizable read: got %q, want MOVED", got)
	}
	// The leader itself serves REDIRECT requests.
	lc.expect(`KEFIR.CALL REDIRECT CMD SET k2 v2 => OK`)

	// Exactly-once across forwarding: the same request id twice executes once,
	// whether the retry goes through the follower or to the leader.
	if got := fc.do("KEFIR.CALL", "REQID", "77", "1", "CMD", "INCR", "ctr"); got != "(integer) 1" {
		t.Fatalf("first INCR: %s", got)
	}
	if got := fc.do("KEFIR.CALL", "REQID", "77", "1", "CMD", "INCR", "ctr"); got != "(integer) 1" {
		t.Fatalf("retried INCR via follower: %s (executed twice?)", got)
	}
	if got := lc.do("KEFIR.CALL", "REQID", "77", "1", "CMD", "INCR", "ctr"); got != "(integer) 1" {
		t.Fatalf("retried INCR at leader: %s", got)
	}
	lc.expect(`GET ctr => "1"`)

	// A session read at the follower sees the session's own forwarded write.
	reply := fc.do("KEFIR.CALL", "SESSION", "", "CMD", "SET", "sk", "sv")
	// A replica group's token names the view of the write's op (v2).
	if !strings.HasPrefix(reply, `["v2.`) || !strings.HasSuffix(reply, `OK]`) {
		t.Fatalf("forwarded write with session: %s", reply)
	}
	tok := strings.Trim(strings.SplitN(reply, ",", 2)[0], `["`)
	if got := fc.do("KEFIR.CALL", "CONSISTENCY", "session", "SESSION", tok, "CMD", "GET", "sk"); !strings.HasSuffix(got, `"sv"]`) {
		t.Fatalf("session read at follower: %s", got)
	}

	// Pipelined writes at a follower are forwarded as one pipeline, in order.
	for i := range 50 {
		fc.send("SET", "p", string(rune('a'+i%26)))
	}
	for range 50 {
		if got := fc.reply(); got != "OK" {
			t.Fatalf("pipelined forwarded SET: %s", got)
		}
	}
	lc.expect(`GET p => "x"`)

	// INFO and /status name the role.
	info := fc.do("INFO", "replication")
	if !strings.Contains(info, "role:follower") || !strings.Contains(info, "leader_id:") {
		t.Fatalf("follower INFO replication: %s", info)
	}
	// HELLO names it the way Redis clients look for the master.
	if _, hf := helloFields(t, dial(t, g.nodes[f]), "3"); hf["role"] != `"replica"` {
		t.Errorf("follower HELLO role = %s, want replica", hf["role"])
	}
	if _, hf := helloFields(t, dial(t, g.nodes[l]), "2"); hf["role"] != `"master"` {
		t.Errorf("leader HELLO role = %s, want master", hf["role"])
	}
	st := fetchStatus(t, g.nodes[l])
	if st.Role != "leader" || st.Replication == nil || st.Replication.Commit == 0 || st.Replication.Leader != uint64(l+1) {
		t.Fatalf("leader /status: role %q replication %+v", st.Role, st.Replication)
	}
}

func TestNoLeaderIsUnavailableNotAWeakerRead(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	f := (l + 1) % 3
	fc := dial(t, g.nodes[f])
	fc.expect(`SET k v => OK`)
	for fc.do("KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "GET", "k") != `"v"` {
		time.Sleep(5 * time.Millisecond) // the follower learns the commit from the next heartbeat
	}
	// Stop both other nodes: the follower is alone and cannot know a leader
	// for long; a linearizable read must fail, never be served locally.
	for i := range g.nodes {
		if i != f {
			g.nodes[i].Close()
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := fc.do("GET", "k")
		if strings.HasPrefix(got, "UNAVAILABLE") {
			break
		}
		if got == `"v"` && vrOf(g.nodes[f]).Info().IsLeader {
			t.Fatal("an isolated follower became leader")
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET at an isolated follower still answers %q", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Eventual reads are served locally, within the eventual window (5 s
	// since the follower last heard a leader holding its lease; issue 24:
	// afterwards it refuses them, docs/consistency.md).
	fc.expect(`KEFIR.CALL CONSISTENCY eventual CMD GET k => "v"`)
}

func TestStaleConfigIsRefused(t *testing.T) {
	g := startGroup(t)
	g.leader(t)
	cfg := g.cfgs[2]
	g.nodes[2].Close()
	g.nodes[2] = nil

	// Restarting with another cluster id or member list is refused.
	bad := cfg
	bad.ClusterID = 43
	if _, err := New(bad); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("other cluster id: got %v, want ErrStaleConfig", err)
	}
	bad = cfg
	bad.Members = append([]Member{cfg.Members[1], cfg.Members[0]}, cfg.Members[2:]...)
	if _, err := New(bad); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("reordered members: got %v, want ErrStaleConfig", err)
	}
	// The right one restarts (without bootstrap: it has its log).
	cfg.Bootstrap = false
	g.nodes[2] = g.start(t, cfg)

	// A node whose disk was wiped rejoins by recovery, it does not bootstrap.
	g.nodes[2].Close()
	if err := os.RemoveAll(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	g.nodes[2] = g.start(t, cfg)
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		role := g.nodes[2].roleName()
		return role == "follower" || role == "leader"
	}) {
		t.Fatalf("wiped node did not rejoin: role %s", g.nodes[2].roleName())
	}
}

func TestReplicationConfigValidation(t *testing.T) {
	ms, err := ParseMembers("1@127.0.0.1:7381/127.0.0.1:6381, 2@127.0.0.1:7382/127.0.0.1:6382,3@127.0.0.1:7383/127.0.0.1:6383")
	if err != nil || len(ms) != 3 || ms[1].ClientAddr != "127.0.0.1:6382" {
		t.Fatalf("ParseMembers: %v %+v", err, ms)
	}
	if FormatMembers(ms) != "1@127.0.0.1:7381/127.0.0.1:6381,2@127.0.0.1:7382/127.0.0.1:6382,3@127.0.0.1:7383/127.0.0.1:6383" {
		t.Fatalf("FormatMembers: %s", FormatMembers(ms))
	}
	for _, bad := range []string{"1@a", "x@127.0.0.1:1/127.0.0.1:2", "0@127.0.0.1:1/127.0.0.1:2", "1@127.0.0.1/127.0.0.1:2"} {
		if _, err := ParseMembers(bad); err == nil {
			t.Errorf("ParseMembers(%q) accepted", bad)
		}
	}
	base := Config{DataDir: "x", PeerAddr: "127.0.0.1:1", ClusterSecret: "s", Members: ms, ReplicaID: 1, ClusterID: 9}
	if err := base.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"self not a member": func(c *Config) { c.ReplicaID = 4 },
		"even group":        func(c *Config) { c.Members = ms[:2] },
		"no cluster id":     func(c *Config) { c.ClusterID = 0 },
		"no secret":         func(c *Config) { c.ClusterSecret = "" },
		"duplicate id":      func(c *Config) { c.Members = []Member{ms[0], ms[0], ms[1]} },
		"replica id alone":  func(c *Config) { c.Members = nil },
	} {
		c := base
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Forwarding works when the client port needs TLS and a password: the
// follower authenticates to the leader with the group's password and trusts
// exactly the group's certificate.
func TestForwardingOverTLSWithPassword(t *testing.T) {
	cert, key := selfSigned(t)
	g := startGroupWith(t, func(c *Config) { c.TLSCert, c.TLSKey, c.Password = cert, key, "pw" })
	l := g.leader(t)
	f := g.nodes[(l+1)%3]
	tc, err := tls.Dial("tcp", f.ClientAddr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	c := &client{t: t, nc: tc, rd: resp.NewReader(tc, 0)}
	c.expect(`
AUTH pw => OK
SET k v => OK
GET k => "v"
`)
	if n := f.router.Forwarded(); n != 2 {
		t.Fatalf("forwarded %d commands, want 2", n)
	}

	// A leader serving another certificate is not trusted.
	other, otherKey := selfSigned(t)
	verify := cluster.VerifyGroupCert(cert, key)
	raw, err := tls.LoadX509KeyPair(other, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(raw.Certificate, nil); err == nil {
		t.Fatal("a foreign certificate was accepted")
	}
	own, _ := tls.LoadX509KeyPair(cert, key)
	if err := verify(own.Certificate, nil); err != nil {
		t.Fatalf("the group's certificate was refused: %v", err)
	}
}

// A pooled forwarding connection that the leader closed while idle is
// replaced without failing the request (which carries a request id the
// follower gave it, so the retry cannot execute it twice).
func TestForwardingSurvivesAnIdleTimeoutAtTheLeader(t *testing.T) {
	g := startGroupWith(t, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	l := g.leader(t)
	f := g.nodes[(l+1)%3]
	for i := range 3 {
		// A fresh client connection each time: the idle timeout applies to it too.
		fc := dial(t, f)
		if got := fc.do("INCR", "n"); got != fmt.Sprintf("(integer) %d", i+1) {
			t.Fatalf("INCR %d via follower: %s", i, got)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// A data directory is never reused in the other mode: that would serve an
// empty store as if it were the node's data.
func TestModeSwitchIsRefused(t *testing.T) {
	single := startServer(t, nil)
	dir := single.cfg.DataDir
	single.Close()
	g := startGroup(t)
	cfg := g.cfgs[0]
	g.nodes[0].Close()
	replicaDir := cfg.DataDir

	cfg.DataDir = dir
	if _, err := New(cfg); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("single-node directory opened as a replica: %v", err)
	}
	if _, err := New(Config{DataDir: replicaDir, ClientAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("replica directory opened as a single node: %v", err)
	}
}

// fetchStatus GETs n's /status and decodes it, failing the test on any error.
func fetchStatus(t *testing.T, n *Server) StatusJSON {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr().String() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st StatusJSON
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}
