package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// startCADGroup is startGroup with cad as the default durability and
// follower reads on every node.
func startCADGroup(t *testing.T) *group {
	t.Helper()
	return startGroupWith(t, "--follower-reads", "true", "--durability", "cad")
}

type cadStatus struct {
	Readable       uint64 `json:"readable_op"`
	Waits          uint64 `json:"reads_durability_wait"`
	FollowerServed uint64 `json:"follower_reads_served"`
	Redirected     uint64 `json:"follower_reads_redirected"`
	EarlyAcks      uint64 `json:"writes_acked_before_commit"`
	Deferred       uint64 `json:"reads_durability_deferred"`
}

func cadStatusOf(n *cluster.Node) (cadStatus, error) {
	var st struct {
		Replication *struct {
			CAD *cadStatus `json:"cad"`
		} `json:"replication"`
	}
	hc := http.Client{Timeout: time.Second}
	r, err := hc.Get("http://" + n.HTTPAddr + "/status")
	if err != nil {
		return cadStatus{}, err
	}
	defer r.Body.Close()
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
		return cadStatus{}, err
	}
	if st.Replication == nil || st.Replication.CAD == nil {
		return cadStatus{}, errors.New("/status has no replication.cad section")
	}
	return *st.Replication.CAD, nil
}

// rawReader is one RESP connection to one node, for reads that must stay at
// that node: KEFIR.CALL without REDIRECT, so a follower that cannot serve
// the read forwards it to the leader itself instead of moving the client.
type rawReader struct {
	addr string
	c    net.Conn
	rd   *bufio.Reader
}

// get reads key at level cons: found, value, or an error (no connection,
// an error reply).
func (r *rawReader) get(key, cons string) (bool, string, error) {
	if r.c == nil {
		c, err := net.DialTimeout("tcp", r.addr, time.Second)
		if err != nil {
			return false, "", err
		}
		r.c, r.rd = c, bufio.NewReader(c)
	}
	fail := func(err error) (bool, string, error) {
		r.c.Close()
		r.c = nil
		return false, "", err
	}
	_ = r.c.SetDeadline(time.Now().Add(10 * time.Second))
	args := []string{"KEFIR.CALL", "CONSISTENCY", cons, "CMD", "GET", key}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(r.c, b.String()); err != nil {
		return fail(err)
	}
	line, err := r.rd.ReadString('\n')
	if err != nil {
		return fail(err)
	}
	switch {
	case strings.HasPrefix(line, "$-1"):
		return false, "", nil
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil {
			return fail(err)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.rd, buf); err != nil {
			return fail(err)
		}
		return true, string(buf[:n]), nil
	case strings.HasPrefix(line, "-"):
		return false, "", errors.New(strings.TrimSpace(line[1:]))
	}
	return fail(fmt.Errorf("unexpected reply %q", line))
}

// A 3-node group with --follower-reads and cad writes: writers put unique
// values (cad) through the Go client, readers at every node read at
// cross-client-monotonic level (served by the followers themselves when
// they can), others read linearizably through the leader. The leader is
// SIGKILLed and restarted, then every node is SIGKILLed at once and
// restarted. No read may return a state older than one any earlier read
// returned (check.CrossClientMonotonic), and no value once read may be lost
// (check.Durability).
func TestCADGroupWithFollowerReadsUnderSIGKILL(t *testing.T) {
	g := startCADGroup(t)
	l := g.settledLeader(-1)
	rec := check.NewRecorder(nil)
	var stop atomic.Bool
	var wg sync.WaitGroup
	keys := []string{"a", "b", "c"}

	for cid := range 3 {
		c := dialGroup(t, g.addrs())
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cid), 11))
			for i := 0; !stop.Load(); i++ {
				key := keys[rng.IntN(len(keys))]
				op := check.Op{Client: cid, Key: key, Kind: check.Put, Value: fmt.Sprintf("w%d-%d", cid, i), Dur: level.CAD}
				id := rec.Invoke(op)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := c.Put(ctx, key, []byte(op.Value), client.WithDurability(client.CAD))
				cancel()
				if err != nil {
					rec.Unknown(id)
				} else {
					rec.Complete(id, check.Result{Node: -1})
				}
			}
		}()
	}
	// Readers: two per node at cross-client-monotonic level, one through
	// the Go client at linearizable level.
	for ni, n := range g.nodes {
		for j := range 2 {
			cid := 10 + 2*ni + j
			wg.Add(1)
			go func() {
				defer wg.Done()
				rr := &rawReader{addr: n.ClientAddr}
				defer func() {
					if rr.c != nil {
						rr.c.Close()
					}
				}()
				rng := rand.New(rand.NewPCG(uint64(cid), 13))
				for !stop.Load() {
					key := keys[rng.IntN(len(keys))]
					id := rec.Invoke(check.Op{Client: cid, Key: key, Kind: check.Get, Cons: level.ConsCrossClient})
					found, v, err := rr.get(key, "cross-client-monotonic")
					if err != nil {
						rec.Fail(id) // a failed read has no effect
						time.Sleep(20 * time.Millisecond)
						continue
					}
					rec.Complete(id, check.Result{Found: found, Value: v, Node: ni})
				}
			}()
		}
	}
	lc := dialGroup(t, g.addrs())
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, 17))
		for !stop.Load() {
			key := keys[rng.IntN(len(keys))]
			id := rec.Invoke(check.Op{Client: 99, Key: key, Kind: check.Get, Cons: level.ConsLinearizable})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			v, err := lc.Get(ctx, key, client.WithConsistency(client.Linearizable))
			cancel()
			switch {
			case err == nil:
				rec.Complete(id, check.Result{Found: true, Value: string(v), Node: -1})
			case errors.Is(err, client.ErrNotFound):
				rec.Complete(id, check.Result{Found: false, Node: -1})
			default:
				rec.Fail(id)
			}
		}
	}()

	var served, waits, deferred uint64
	tally := func() {
		for _, n := range g.nodes {
			if st, err := cadStatusOf(n); err == nil {
				served += st.FollowerServed
				waits += st.Waits
				deferred += st.Deferred
			}
		}
	}
	time.Sleep(1500 * time.Millisecond)
	tally()
	g.nodes[l].Kill()
	rec.Crash(l)
	nl := g.leader(l)
	t.Logf("SIGKILLed leader %s; %s leads", g.nodes[l].ID, g.nodes[nl].ID)
	time.Sleep(time.Second)
	g.nodes[l].Start()
	time.Sleep(1500 * time.Millisecond)

	tally()
	for i, n := range g.nodes {
		n.Kill()
		rec.Crash(i)
	}
	t.Log("SIGKILLed every node")
	for _, n := range g.nodes {
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range g.nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("%s not ready after restart: %v", n.ID, err)
		}
	}
	g.leader(-1)
	time.Sleep(2 * time.Second)
	tally()
	stop.Store(true)
	wg.Wait()

	h := rec.History()
	okOps, _ := h.Outcomes()
	t.Logf("%d operations (%d ok), %d crashes; followers served %d reads themselves, %d reads waited for durability (%d deferred)",
		len(h.Ops), okOps, len(h.Crashes), served, waits, deferred)
	if okOps < 200 {
		t.Fatalf("only %d operations completed", okOps)
	}
	if served == 0 {
		t.Fatal("no cross-client-monotonic read was served by a follower: the test did not test follower reads")
	}
	if v := check.CrossClientMonotonic(h); !v.OK || v.Checked == 0 {
		t.Fatalf("cross-client monotonic (%d judged):\n%v", v.Checked, v)
	}
	if v := check.Durability(h); !v.OK {
		t.Fatalf("durability:\n%v", v)
	}
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + g.nodes[0].HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"kefir_reads_durability_wait_total", "kefir_reads_durability_deferred_total", "kefir_follower_reads_total", "kefir_vr_readable_op"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}
