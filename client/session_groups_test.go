package client

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/server"
)

// A Session of the Go client on a node of two groups (in-process, three
// nodes hosting both): its token becomes a v3 token with a part per group,
// the client merges the replies' tokens, and a session resumed from that
// token by a client of another node reads both groups' writes at level
// session.
func TestSessionTokenAcrossGroups(t *testing.T) {
	groups := []kcluster.GroupSpec{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1, 2, 3}, Slots: []kcluster.SlotRange{{Start: 8192, End: 16383}}},
	}
	addrs := clientAddrs(startNodes(t, func(c *server.Config) { c.Groups = groups }))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ka, kb string
	for i := 0; ka == "" || kb == ""; i++ {
		k := fmt.Sprint("k", i)
		if kcluster.Slot([]byte(k)) < 8192 {
			ka = k
		} else {
			kb = k
		}
	}
	w := dialGroup(t, ctx, []string{addrs[0]}, nil)
	defer w.Close()
	s := w.Session()
	for _, k := range []string{ka, kb} {
		if err := s.Put(ctx, k, []byte("v-"+k)); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
	}
	tok := s.Token()
	if !strings.HasPrefix(tok, "v3.1:") || !strings.Contains(tok, ",2:") {
		t.Fatalf("token after writes to both groups = %q, want v3 with parts of groups 1 and 2", tok)
	}
	if _, err := parseToken(tok); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		r := dialGroup(t, ctx, []string{addrs[i]}, nil)
		rs := r.Session()
		if err := rs.Resume(tok); err != nil {
			t.Fatalf("Resume(%q): %v", tok, err)
		}
		for _, k := range []string{ka, kb} {
			v, err := rs.Get(ctx, k, WithConsistency(SessionConsistency))
			if err != nil || string(v) != "v-"+k {
				t.Fatalf("node %d: session Get %s = %q, %v", i+1, k, v, err)
			}
		}
		if got := rs.Token(); !strings.HasPrefix(got, "v3.") {
			t.Fatalf("token after the reads = %q", got)
		}
		r.Close()
	}
	t.Logf("token %s", tok)
}
