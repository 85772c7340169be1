package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// txConn is one RESP connection (KEFIR.TX handles are a connection's).
type txConn struct {
	t  *testing.T
	nc net.Conn
	rd *resp.Reader
}

func dialTx(t *testing.T, addr string) *txConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	return &txConn{t: t, nc: nc, rd: resp.NewReader(nc, 0)}
}

// do sends a command and returns its reply printed: an integer as its
// digits, a bulk as its bytes, an error as its text.
func (c *txConn) do(args ...string) (string, error) {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	if _, err := c.nc.Write(resp.AppendCommand(nil, bs...)); err != nil {
		return "", err
	}
	v, err := c.rd.ReadValue()
	if err != nil {
		return "", err
	}
	switch v.Kind {
	case resp.Int:
		return strconv.FormatInt(v.Int, 10), nil
	case resp.Null:
		return "(nil)", nil
	}
	return string(v.Str), nil
}

func (c *txConn) must(want string, args ...string) string {
	c.t.Helper()
	got, err := c.do(args...)
	if err != nil {
		c.t.Fatalf("%v: %v", args, err)
	}
	if want != "*" && !strings.HasPrefix(got, want) {
		c.t.Fatalf("%v = %q, want %q", args, got, want)
	}
	return got
}

// Issue 29 on a cluster of three groups: a transaction runs in the group of
// its first key's slot, at that group's leader; with cross-group
// transactions switched off (--cross-group-tx false; they are on by
// default, tested by TestTxCrossGroupBankLeaderKill) a key of another slot
// is refused with CROSSSLOT; its commit lands in that group.
func TestTxInAClusterOfGroups(t *testing.T) {
	g := cluster.StartGroups(t, 3, threeGroups, "--cross-group-tx", "false")
	g.WaitLeaders(20 * time.Second)
	slot := int(kcluster.Slot([]byte("{acct}a")))
	l := g.SlotLeader(slot)
	if l < 0 {
		t.Fatal("no leader for the slot")
	}
	c := dialTx(t, g.Nodes[l].ClientAddr)
	c.must("OK", "SET", "{acct}a", "10")
	h := c.must("1", "KEFIR.TX", "BEGIN")
	c.must("10", "KEFIR.TX", "GET", h, "{acct}a")
	c.must("7", "KEFIR.TX", "INCRBY", h, "{acct}a", "-3")
	c.must("OK", "KEFIR.TX", "SET", h, "{acct}b", "3")
	c.must("CROSSSLOT", "KEFIR.TX", "SET", h, "elsewhere", "x")
	c.must("*", "KEFIR.TX", "COMMIT", h)
	for _, n := range g.Nodes {
		v, err := cluster.Command(n.ClientAddr, "MGET", "{acct}a", "{acct}b")
		if err != nil || len(v.Elems) != 2 || string(v.Elems[0].Str) != "7" || string(v.Elems[1].Str) != "3" {
			t.Fatalf("MGET at %s = %v %v", n.ID, v, err)
		}
	}
	// At a node that does not lead the slot's group, the first key
	// redirects.
	o := dialTx(t, g.Nodes[(l+1)%3].ClientAddr)
	h = o.must("1", "KEFIR.TX", "BEGIN")
	if got, _ := o.do("KEFIR.TX", "GET", h, "{acct}a"); !strings.HasPrefix(got, "MOVED") {
		t.Fatalf("a transaction's first key at a follower of its group: %q, want MOVED", got)
	}
}

// Commits acknowledged before a node is killed (SIGKILL) are all there when
// it restarts, each whole: exactly the acknowledged ones, as one counter
// and one key per commit show.
func TestTxCommitsSurviveKill(t *testing.T) {
	n := cluster.NewNode(t, "n1")
	n.Start()
	c := dialTx(t, n.ClientAddr)
	acked := 0
	for i := range 40 {
		h := c.must("*", "KEFIR.TX", "BEGIN")
		c.must("*", "KEFIR.TX", "INCRBY", h, "count", "1")
		c.must("OK", "KEFIR.TX", "SET", h, fmt.Sprint("k", i), "v")
		c.must("*", "KEFIR.TX", "COMMIT", h)
		acked++
	}
	n.Kill()
	n.Start()
	c = dialTx(t, n.ClientAddr)
	c.must(strconv.Itoa(acked), "GET", "count")
	c.must(strconv.Itoa(acked), append([]string{"EXISTS"}, func() []string {
		var ks []string
		for i := range acked {
			ks = append(ks, fmt.Sprint("k", i))
		}
		return ks
	}()...)...)
}

// Fine-grained conflicts (docs/design/transactions.md, "Fine-grained
// conflicts") with real processes: on a 3-replica group, over RESP to the
// leader, two clients' KEFIR.TX transactions open at once that write
// disjoint bit ranges of one key — SETBIT of different bits, BITFIELD
// INCRBY of different fields — both commit, and every replica then holds
// both writes; ranges that overlap abort the second commit with TXABORT
// and leave the first's write alone. Under SI and SERIALIZABLE.
func TestTxFineGrainedConflictsReplicated(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)
	a, b := dialTx(t, g.nodes[l].ClientAddr), dialTx(t, g.nodes[l].ClientAddr)
	for _, iso := range []string{"SI", "SERIALIZABLE"} {
		key := "bits-" + iso
		a.must("OK", "SET", key, "\x00\x00\x00\x00")
		pair := func(opA, opB []string) (string, string) {
			ha := a.must("*", "KEFIR.TX", "BEGIN", iso)
			hb := b.must("*", "KEFIR.TX", "BEGIN", iso)
			a.must("*", append([]string{"KEFIR.TX", opA[0], ha, key}, opA[1:]...)...)
			b.must("*", append([]string{"KEFIR.TX", opB[0], hb, key}, opB[1:]...)...)
			ca, err := a.do("KEFIR.TX", "COMMIT", ha)
			if err != nil {
				t.Fatal(err)
			}
			cb, err := b.do("KEFIR.TX", "COMMIT", hb)
			if err != nil {
				t.Fatal(err)
			}
			return ca, cb
		}
		committed := func(s string) bool { _, err := strconv.ParseUint(s, 10, 64); return err == nil }

		// Different bits of byte 0 (bits 1 and 6), and different u4 fields
		// of byte 1: both commit.
		if ca, cb := pair([]string{"SETBIT", "1", "1"}, []string{"SETBIT", "6", "1"}); !committed(ca) || !committed(cb) {
			t.Fatalf("%s: different bits: commits %q and %q, want both", iso, ca, cb)
		}
		if ca, cb := pair([]string{"BITFIELD", "INCRBY", "u4", "8", "3"}, []string{"BITFIELD", "INCRBY", "u4", "12", "5"}); !committed(ca) || !committed(cb) {
			t.Fatalf("%s: different fields: commits %q and %q, want both", iso, ca, cb)
		}
		// The same bit, and overlapping fields (u8 at bit 16 against u4 at
		// bit 20): the second aborts.
		if ca, cb := pair([]string{"SETBIT", "3", "1"}, []string{"SETBIT", "3", "0"}); !committed(ca) || !strings.HasPrefix(cb, "TXABORT") {
			t.Fatalf("%s: the same bit: commits %q and %q, want the second TXABORT", iso, ca, cb)
		}
		if ca, cb := pair([]string{"BITFIELD", "SET", "u8", "16", "255"}, []string{"BITFIELD", "INCRBY", "u4", "20", "1"}); !committed(ca) || !strings.HasPrefix(cb, "TXABORT") {
			t.Fatalf("%s: overlapping fields: commits %q and %q, want the second TXABORT", iso, ca, cb)
		}
		// Byte 0: bits 1, 3 and 6 (0x52); byte 1: 3 and 5 (0x35); byte 2:
		// 255, the aborted INCRBY not in it; byte 3 untouched. At every
		// replica.
		for _, n := range g.nodes {
			v, err := cluster.Command(n.ClientAddr, "GET", key)
			if err != nil || string(v.Str) != "\x52\x35\xff\x00" {
				t.Fatalf("%s: GET at %s = %q %v, want %q", iso, n.ID, v.Str, err, "\x52\x35\xff\x00")
			}
		}
	}
}
