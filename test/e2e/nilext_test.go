package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// startNilextGroup is startGroup with --nilext on every node.
func startNilextGroup(t *testing.T) *group {
	t.Helper()
	return startGroupWith(t, "--nilext", "true")
}

func nilextFast(n *cluster.Node) uint64 {
	var st struct {
		Replication *struct {
			Nilext *struct {
				Fast uint64 `json:"fast_writes"`
			} `json:"nilext"`
		} `json:"replication"`
	}
	hc := http.Client{Timeout: time.Second}
	r, err := hc.Get("http://" + n.HTTPAddr + "/status")
	if err != nil {
		return 0
	}
	defer r.Body.Close()
	if json.NewDecoder(r.Body).Decode(&st) != nil || st.Replication == nil || st.Replication.Nilext == nil {
		return 0
	}
	return st.Replication.Nilext.Fast
}

// rawSet sends a plain RESP SET (what redis-cli sends: no request id, so a
// --nilext node coordinates it on the fast path) and reports whether the
// reply was +OK.
func rawSet(c net.Conn, rd *bufio.Reader, k, v string) bool {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(v), v); err != nil {
		return false
	}
	line, err := rd.ReadString('\n')
	return err == nil && line == "+OK\r\n"
}

// A --nilext group answers redis-cli SET/GET through every node; under a
// load of plain SETs through every node the leader is SIGKILLed; every
// write acknowledged before, during and after is there afterwards.
func TestNilextGroupKeepsAcknowledgedWritesAcrossLeaderSIGKILL(t *testing.T) {
	g := startNilextGroup(t)
	l := g.settledLeader(-1)
	for i, n := range g.nodes {
		k := "cli" + strconv.Itoa(i)
		if got := redisCLI(t, n.ClientAddr, "SET", k, "v"+k); got != "OK" {
			t.Fatalf("redis-cli SET via %s: %q", n.ID, got)
		}
		for _, m := range g.nodes {
			if got := redisCLI(t, m.ClientAddr, "GET", k); got != "v"+k {
				t.Fatalf("redis-cli GET %s via %s: %q", k, m.ID, got)
			}
		}
	}

	var stop atomic.Bool
	var mu sync.Mutex
	acked := map[string]string{}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := w % 3
			var c net.Conn
			var rd *bufio.Reader
			for i := 0; !stop.Load(); i++ {
				if c == nil {
					var err error
					if c, err = net.DialTimeout("tcp", g.nodes[node].ClientAddr, time.Second); err != nil {
						c = nil
						node = (node + 1) % 3
						time.Sleep(20 * time.Millisecond)
						continue
					}
					rd = bufio.NewReader(c)
				}
				k, v := fmt.Sprintf("w%d-%d", w, i), fmt.Sprintf("v%d", i)
				if rawSet(c, rd, k, v) {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
					continue
				}
				c.Close()
				c = nil
				node = (node + 1) % 3
			}
			if c != nil {
				c.Close()
			}
		}()
	}
	time.Sleep(time.Second)
	g.nodes[l].Kill()
	nl := g.leader(l)
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	if fast := nilextFast(g.nodes[nl]) + nilextFast(g.nodes[3-l-nl]); fast == 0 {
		t.Fatal("no write took the fast path on the surviving nodes")
	}
	g.nodes[l].Start()
	c := dialGroup(t, g.addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lost := 0
	for k, v := range acked {
		got, err := c.Get(ctx, k)
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("get %s: %v", k, err)
		}
		if err != nil || string(got) != v {
			lost++
			if lost < 5 {
				t.Errorf("acknowledged SET %s=%s: read %q (%v)", k, v, got, err)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged nilext writes lost", lost, len(acked))
	}
	t.Logf("%d acknowledged writes checked after the leader's SIGKILL", len(acked))
	for i, n := range g.nodes {
		if got := redisCLI(t, n.ClientAddr, "GET", "cli"+strconv.Itoa(i)); got != "vcli"+strconv.Itoa(i) {
			t.Fatalf("after restart: GET via %s: %q", n.ID, got)
		}
	}
}
