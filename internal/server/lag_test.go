package server

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
)

// /status and /metrics at a node of two groups show each group's slot
// count, leader and replication lag: with one follower's peer links cut,
// writes to group 1 leave that follower behind, and the leader of group 1
// reports it (followers[].lag_ops and kefir_group_follower_lag_ops grow
// with the writes) while the other follower stays at 0; once the links
// heal the lag returns to 0. On the code before, /status had no lag and
// /metrics no per-group series.
func TestStatusShowsEachGroupsLag(t *testing.T) {
	g := startTwoGroups(t)
	l1 := groupLeaders(g, 1)[0]
	cut := (l1 + 1) % len(g.nodes)
	g.isolatePeers(t, cut, true)
	healed := false
	defer func() {
		if !healed {
			g.isolatePeers(t, cut, false)
		}
	}()
	c := dial(t, g.nodes[l1])
	const writes = 50
	for i := range writes {
		c.expect("SET " + keyOfGroup(1, "lag"+strings.Repeat("y", i)) + " v => OK")
	}
	cutID := g.cfgs[cut].ReplicaID
	lagOf := func() (cutLag, otherLag uint64, gs GroupStatus) {
		t.Helper()
		for _, s := range fetchStatus(t, g.nodes[l1]).Groups {
			if s.ID != 1 {
				continue
			}
			gs = s
			for _, f := range s.Followers {
				if f.ID == cutID {
					cutLag = f.Lag
				} else {
					otherLag = max(otherLag, f.Lag)
				}
			}
		}
		return cutLag, otherLag, gs
	}
	var cutLag, otherLag uint64
	var gs GroupStatus
	deadline := time.Now().Add(5 * time.Second)
	for {
		cutLag, otherLag, gs = lagOf()
		if cutLag >= writes && otherLag == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cutLag < writes || otherLag != 0 || len(gs.Followers) != 2 || gs.SlotCount != 8192 || gs.Role != cluster.RoleLeader {
		t.Fatalf("group 1 at its leader: %+v; cut follower's lag %d (want >= %d), the other's %d (want 0)", gs, cutLag, writes, otherLag)
	}
	r, err := http.Get("http://" + g.nodes[l1].HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{`kefir_group_slots{group="1"} 8192`, `kefir_group_slots{group="2"} 8192`,
		`kefir_group_is_leader{group="1"} 1`, `kefir_group_lag_ops{group="1"} 0`,
		`kefir_group_follower_lag_ops{follower="` + strconv.FormatUint(cutID, 10) + `",group="1"} `} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, grepLines(string(body), "kefir_group_"))
		}
	}
	r, err = http.Get("http://" + g.nodes[l1].HTTPAddr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(r.Body)
	r.Body.Close()
	if want := "<td>1</td><td>8192 (0-8191)</td>"; !strings.Contains(string(body), want) || !strings.Contains(string(body), "<h2>Groups</h2>") {
		t.Fatalf("the admin page lacks the groups table (%q):\n%s", want, body)
	}
	g.isolatePeers(t, cut, false)
	healed = true
	deadline = time.Now().Add(10 * time.Second)
	for cutLag, _, _ = lagOf(); cutLag != 0; cutLag, _, _ = lagOf() {
		if time.Now().After(deadline) {
			t.Fatalf("the follower's lag stayed %d after its links healed", cutLag)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grepLines returns s's lines that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
