package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// The command scripts on a chain (kefir server --engine chain; issue 27:
// every command answers the same on a single node and on either engine).
// expectOnGroup's counterpart: expectOnChain.

// startChain starts a chain of three in-process nodes (kefir server
// --engine chain, SU, the master hosted by the nodes), head first, node i's
// member on stores[i] (--chain-stores), and waits until every member serves
// a linearizable read of a write answered by the head.
func startChain(t testing.TB, stores ...vrshard.ChainStore) *group {
	t.Helper()
	if len(stores) != 3 {
		t.Fatalf("startChain: %d stores, want 3", len(stores))
	}
	g := startGroupWith(t, func(c *Config) {
		c.Chain = true
		c.OpenReplica = vrshard.OpenHostedChainNode(0, vrshard.ChainStoreOptions{Store: stores[c.ReplicaID-1]})
	})
	cs := make([]*client, len(g.nodes))
	for i, s := range g.nodes {
		cs[i] = dial(t, s)
	}
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		if cs[0].do("SET", "chain-warm", "w") != "OK" {
			return false
		}
		for _, c := range cs {
			if c.do("GET", "chain-warm") != `"w"` {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the chain did not serve a write at its head and reads at every member within 20s")
	}
	// Node 1 is the head (the members are the chain, head first), which
	// every member names as its leader.
	for i, s := range g.nodes {
		if in := vrOf(s).Info(); in.Leader != 1 || in.IsLeader != (i == 0) {
			t.Fatalf("node %d: leader %d, leads %v; want the head, node 1", i+1, in.Leader, in.IsLeader)
		}
	}
	// A chain indeed: CLUSTER SLOTS says so of its nodes.
	if got, want := cs[0].do("CLUSTER", "SLOTS"), fmt.Sprintf("[%q, %q]", ClusterEngineField, kv.EngineChain); !strings.Contains(got, want) {
		t.Fatalf("CLUSTER SLOTS of the chain names no %s: %s", want, got)
	}
	if got := cs[0].do("DEL", "chain-warm"); got != "(integer) 1" {
		t.Fatalf("DEL chain-warm at the head: %s", got)
	}
	return g
}

// expectOnChain runs script on a chain of memory, memory and log members
// (the thesis's "memory head, disk tail"), as expectOnGroup on a VR group:
// through the head, each read line (command.Read) also at the middle member
// and the tail right after the head's reply, expecting the script's reply
// (a read is served at any member, CRAQ: docs/chain.md "Levels"); then
// through the middle member and through the tail (which forward writes to
// the head); then through the head at every consistency level, the reads
// at every member again at each level but eventual (memberLevel). It
// returns its clients of the members, head first, at level eventual.
func expectOnChain(t *testing.T, script string) []*client {
	t.Helper()
	g := startChain(t, vrshard.ChainMemory, vrshard.ChainMemory, vrshard.ChainLog)
	cs := make([]*client, len(g.nodes))
	for i, s := range g.nodes {
		cs[i] = dial(t, s)
	}
	head, members := cs[0], cs[1:]
	name := []string{"the middle member", "the tail"}
	// DBSIZE counts what the member it asks has applied (docs/commands.md):
	// a member behind the head's answer may not have applied its last write
	// yet, as a VR follower; DBSIZE is checked at the head only.
	noDBSIZE := withoutLines(script, "DBSIZE")
	run := func(lvl string) {
		t.Helper()
		every := memberLevel(lvl)
		for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
			head.expect(line)
			if !every || !isRead(line) || strings.HasPrefix(line, "DBSIZE") {
				continue
			}
			for i, m := range members {
				if lvl == "session" {
					// The session is the head's connection's: its token,
					// which names the head's writes, goes with the read (a
					// member's own connection has seen none of them).
					if got := m.do("KEFIR.SESSION", sessionToken(t, head)); got != "OK" {
						t.Fatalf("KEFIR.SESSION at %s: %s", name[i], got)
					}
				}
				m.t = &memberT{TB: t, prefix: name[i] + " at " + lvl + ": "}
				m.expect(line)
				m.t = t
			}
		}
	}
	run("the default level")
	for i, m := range members {
		m.t = &memberT{TB: t, prefix: name[i] + ", the whole script: "}
		m.expect(noDBSIZE)
		m.t = t
	}
	for _, lvl := range []string{"linearizable", "cross-client-monotonic", "session", "bounded(5)", "eventual"} {
		for _, c := range cs {
			if got := c.do("KEFIR.CONSISTENCY", lvl); got != "OK" {
				t.Fatalf("KEFIR.CONSISTENCY %s: %s", lvl, got)
			}
		}
		run(lvl)
	}
	// The members served the reads themselves (not only forwarded them).
	for i, s := range g.nodes {
		st := vrOf(s).Stats()
		t.Logf("node %d's chain reads: %d clean, %d to the tail, %d waits, %d by version; %d local", i+1, st.ChainClean, st.ChainToTail, st.ChainWaits, st.ChainVersionReads, st.LocalReads)
		if st.LocalReads == 0 {
			t.Errorf("node %d served no read itself", i+1)
		}
	}
	return cs
}

// memberLevel reports whether expectOnChain checks a script's reads at
// every member at level lvl: at every level the chain serves at any member
// with no older state than the head's answers (docs/chain.md, "Levels"):
// linearizable, cross-client-monotonic, bounded (as linearizable on a
// chain), and session given the head's token. Not eventual: a member
// serves it from the state it applied, which may be behind the head's
// answer of the line before (the tail's TTL k answered the previous
// write's expiry, its GET of a key just made a hash still the string: the
// level's contract, as at a VR follower); expectOnGroup checks eventual at
// the leader only, and expectOnChain at the head only.
func memberLevel(lvl string) bool { return lvl != "eventual" }

// sessionToken is c's session token (KEFIR.SESSION).
func sessionToken(t testing.TB, c *client) string {
	t.Helper()
	c.send("KEFIR.SESSION")
	v, err := c.rd.ReadValue()
	if err != nil || v.Kind != resp.Bulk {
		t.Fatalf("KEFIR.SESSION: %v %v", show(v), err)
	}
	return string(v.Str)
}

// isRead reports whether a script line's command is a read (command.Read).
func isRead(line string) bool {
	cmd, _, _ := strings.Cut(line, "=>")
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return false
	}
	s, ok := command.Lookup([]byte(f[0]))
	if !ok {
		return false
	}
	argv := make([][]byte, len(f))
	for i, a := range f {
		argv[i] = []byte(a)
	}
	return command.Classify(s, argv) == command.Read
}

// memberT names the member in a script's failure.
type memberT struct {
	testing.TB
	prefix string
}

func (m *memberT) Errorf(format string, args ...any) {
	m.TB.Helper()
	m.TB.Errorf(m.prefix+format, args...)
}
func (m *memberT) Fatalf(format string, args ...any) {
	m.TB.Helper()
	m.TB.Fatalf(m.prefix+format, args...)
}

func TestKeyspaceCommandsChain(t *testing.T) {
	cs := expectOnChain(t, keyspaceScript)
	checkErrors(t, cs[2])
}

func TestHashCommandsChain(t *testing.T) { expectOnChain(t, hashScript) }

// The expiry script on a chain (expectOnChain), and, as
// TestExpiryReplicated on a VR group, a key with a TTL is at every member
// before its expiry and gone at every member and every level after it.
func TestExpiryCommandsChain(t *testing.T) {
	cs := expectOnChain(t, expiryScript)
	set := time.Now()
	cs[0].expect(`
SET e v PX 2000 => OK
SET p v => OK
`)
	for i, c := range cs {
		c.expect(`KEFIR.CONSISTENCY linearizable => OK`)
		// (Not if a loaded box stalled the test past most of the TTL.)
		if got := c.do("GET", "e"); got != `"v"` && time.Since(set) < 1500*time.Millisecond {
			t.Errorf("member %d: GET e before its expiry = %s", i+1, got)
		}
	}
	time.Sleep(time.Until(set.Add(2100 * time.Millisecond)))
	for i, c := range cs {
		for _, lvl := range []string{"linearizable", "cross-client-monotonic", "session", "bounded(5)", "eventual"} {
			c.expect("KEFIR.CONSISTENCY " + lvl + " => OK")
			if got := c.do("GET", "e"); got != "(nil)" {
				t.Errorf("member %d at %s: GET e after its expiry = %s", i+1, lvl, got)
			}
			if got := c.do("EXISTS", "e", "p"); got != "(integer) 1" {
				t.Errorf("member %d at %s: EXISTS e p = %s", i+1, lvl, got)
			}
		}
	}
	cs[0].expect(`
GET e => (nil)
TTL e => (integer) -2
`)
}
