package client

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// txWire counts, per node address, the KEFIR.TX commands and the commits
// (KEFIR.TXAPPLY) written to it, and the connections that carried a
// KEFIR.TX command.
type txWire struct {
	mu    sync.Mutex
	tx    map[string]int
	apply map[string]int
	conns atomic.Int64
}

func (w *txWire) wrap(nc net.Conn) net.Conn { return &txWireConn{Conn: nc, w: w} }

func (w *txWire) counts() (tx, apply map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tx, apply = map[string]int{}, map[string]int{}
	for a, n := range w.tx {
		tx[a] = n
	}
	for a, n := range w.apply {
		apply[a] = n
	}
	return tx, apply
}

type txWireConn struct {
	net.Conn
	w       *txWire
	counted bool
}

var (
	txMarker    = []byte("$8\r\nKEFIR.TX\r\n")
	applyMarker = []byte("$13\r\nKEFIR.TXAPPLY\r\n")
)

func (c *txWireConn) Write(b []byte) (int, error) {
	addr := c.RemoteAddr().String()
	ntx, napply := bytes.Count(b, txMarker), bytes.Count(b, applyMarker)
	if ntx+napply > 0 {
		c.w.mu.Lock()
		if c.w.tx == nil {
			c.w.tx, c.w.apply = map[string]int{}, map[string]int{}
		}
		c.w.tx[addr] += ntx
		c.w.apply[addr] += napply
		c.w.mu.Unlock()
		if ntx > 0 && !c.counted {
			c.counted = true
			c.w.conns.Add(1)
		}
	}
	return c.Conn.Write(b)
}

// leaderAddr is the client address of the node that leads group g (index
// in the layout) as node 0 sees it.
func leaderAddr(nodes []*server.Server, g int) string {
	for _, n := range nodes {
		if n == nil {
			continue
		}
		l := n.Status().Groups[g].Leader
		if l != 0 && nodes[l-1] != nil {
			return nodes[l-1].ClientAddr().String()
		}
	}
	return ""
}

// A transaction goes to the leader of its first key's group through the
// slot map's node pools, as a keyed call does: a client dialed to node 1
// alone runs transactions on keys of a group node 1 does not lead, and
// every KEFIR.TX command and every commit is written to that group's leader
// (none to node 1), no attempt is redirected (fn runs once per
// transaction), and no node forwards anything; then transactions taking
// turns over the three groups run once each, over one transaction
// connection per node. Before, a transaction began through the addresses
// given to Dial: its first attempt was refused there (-MOVED), and the
// client's own pool followed the redirect, so transactions of two groups
// taking turns each paid a wasted attempt and a new connection.
func TestClusterTxnGoesToItsGroupsLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	g := -1 // a group node 1 does not lead
	for i, gs := range nodes[0].Status().Groups {
		if gs.Leader != 1 {
			g = i
			break
		}
	}
	if g < 0 {
		t.Skip("node 1 leads every group")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wire txWire
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithPoolSize(1), WithRetryUnavailable(5*time.Second),
		func(o *options) { o.wrapConn = wire.wrap })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := keysOf(kefirUpLayout, 10)
	var runs atomic.Int64
	incr := func(key string) error {
		return c.Txn(ctx, func(tx *Tx) error {
			runs.Add(1)
			v, err := tx.Get(ctx, key)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			n, _ := strconv.Atoi(string(v))
			return tx.Set(ctx, key, []byte(strconv.Itoa(n+1)))
		}, nil)
	}
	fwd0 := forwardedBy(nodes)
	for _, k := range keys[g] {
		if err := incr(k); err != nil {
			t.Fatalf("Txn on %s: %v", k, err)
		}
	}
	want := leaderAddr(nodes, g)
	tx, apply := wire.counts()
	for a, n := range tx {
		if a != want && n > 0 {
			t.Errorf("%d KEFIR.TX commands of group %d's transactions went to %s, not its leader %s", n, g+1, a, want)
		}
	}
	for a, n := range apply {
		if a != want && n > 0 {
			t.Errorf("%d commits of group %d's transactions went to %s, not its leader %s", n, g+1, a, want)
		}
	}
	if tx[want] == 0 || apply[want] != len(keys[g]) {
		t.Errorf("group %d's leader %s got %d KEFIR.TX commands and %d commits, want some and %d", g+1, want, tx[want], apply[want], len(keys[g]))
	}
	if r := runs.Load(); r != int64(len(keys[g])) {
		t.Errorf("%d transactions ran fn %d times: attempts were redirected", len(keys[g]), r)
	}

	// Taking turns over the groups.
	runs.Store(0)
	conns0 := wire.conns.Load()
	for i := range keys[0] {
		for _, ks := range keys {
			if err := incr(ks[i]); err != nil {
				t.Fatalf("Txn on %s: %v", ks[i], err)
			}
		}
	}
	if r, n := runs.Load(), int64(len(keys)*len(keys[0])); r != n {
		t.Errorf("%d transactions taking turns over the groups ran fn %d times: attempts were redirected", n, r)
	}
	// One transaction connection per node at most (WithPoolSize(1); group
	// g's leader's is open already).
	if d := wire.conns.Load() - conns0; d > 2 {
		t.Errorf("transactions taking turns over three groups opened %d transaction connections, want at most 2 more", d)
	}
	if f := forwardedBy(nodes) - fwd0; f != 0 {
		t.Errorf("the nodes forwarded %d commands of single-group transactions", f)
	}
	for gi, ks := range keys {
		for _, k := range ks {
			want := "1"
			if gi == g {
				want = "2"
			}
			if v, err := c.Get(ctx, k); err != nil || string(v) != want {
				t.Errorf("%s = %q, %v; want %s", k, v, err, want)
			}
		}
	}
}

// A transaction follows its group's leader change: transactions of a group
// whose leader is closed retry (Txn's own retries, the slot map fetched
// anew) and commit at the new leader, while another group's go on; every
// increment that committed is counted once.
func TestClusterTxnFollowsALeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes of three groups")
	}
	nodes := startGroups(t, kefirUpLayout)
	st := nodes[0].Status().Groups
	g := -1 // a group led away from node 1 (the client's seed)
	for i, gs := range st {
		if gs.Leader != 1 {
			g = i
			break
		}
	}
	if g < 0 {
		t.Skip("node 1 leads every group")
	}
	victim := int(st[g].Leader - 1)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var wire txWire
	c, err := Dial(ctx, []string{nodes[0].ClientAddr().String()}, WithRetryUnavailable(15*time.Second), WithMaxRetries(5),
		func(o *options) { o.wrapConn = wire.wrap })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := keysOf(kefirUpLayout, 1)[g][0]
	var committed, unknown, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := c.Txn(ctx, func(tx *Tx) error {
					v, err := tx.Get(ctx, key)
					if err != nil && !errors.Is(err, ErrNotFound) {
						return err
					}
					n, _ := strconv.Atoi(string(v))
					return tx.Set(ctx, key, []byte(strconv.Itoa(n+1)))
				}, &TxOptions{MaxAttempts: 40})
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, ErrUnknownOutcome):
					unknown.Add(1)
				default:
					// Spent its attempts during the election, or no node
					// could be reached: nothing committed.
					failed.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return committed.Load() >= 20 }) {
		t.Fatal("no transactions committed before the leader change")
	}
	nodes[victim].Close()
	nodes[victim] = nil
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		l := nodes[0].Status().Groups[g].Leader
		return l != 0 && l != uint64(victim+1)
	}) {
		t.Fatal("the group elected no new leader")
	}
	newLeader := leaderAddr(nodes, g)
	tx0, _ := wire.counts()
	c0 := committed.Load()
	if !testgroup.Until(15*time.Second, 10*time.Millisecond, func() bool { return committed.Load() >= c0+20 }) {
		t.Fatal("transactions did not resume after the election")
	}
	close(stop)
	wg.Wait()
	tx1, _ := wire.counts()
	if tx1[newLeader] <= tx0[newLeader] {
		t.Errorf("no KEFIR.TX commands went to the new leader %s after the election", newLeader)
	}
	v, err := c.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(string(v))
	if lo, hi := committed.Load(), committed.Load()+unknown.Load(); int64(n) < lo || int64(n) > hi {
		t.Fatalf("%s = %d after %d committed and %d unknown increments", key, n, lo, unknown.Load())
	}
	t.Logf("%d committed, %d unknown, %d gave up; %s = %d; the new leader %s got %d KEFIR.TX commands after the election",
		committed.Load(), unknown.Load(), failed.Load(), key, n, newLeader, tx1[newLeader]-tx0[newLeader])
}
