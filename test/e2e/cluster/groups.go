package cluster

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// Groups is a cluster of several replica groups over real nodes on a static
// slot map (kefir server --groups).
type Groups struct {
	t     testing.TB
	Nodes []*Node
}

// groupsSecret is the peer secret of a Groups cluster.
const groupsSecret = "e2e-groups-secret"

// StartGroups starts nodes nodes (ids 1..nodes) hosting the groups of
// groups (kefir server --groups; the caller lays them out, e.g. with
// internal/cluster's EvenGroups, which this package must not import: that
// package's tests use this one), bootstrapping them, with extra flags on
// every node.
func StartGroups(t testing.TB, nodes int, groups string, extra ...string) *Groups {
	t.Helper()
	return StartGroupsEach(t, nodes, groups, nil, extra...)
}

// StartGroupsEach is StartGroups with each node's own flags too: each(i)
// for node i+1 (nil: none), e.g. its --zone.
func StartGroupsEach(t testing.TB, nodes int, groups string, each func(i int) []string, extra ...string) *Groups {
	t.Helper()
	g := &Groups{t: t}
	var ms []string
	for i := range nodes {
		n := NewNode(t, "n"+strconv.Itoa(i+1))
		g.Nodes = append(g.Nodes, n)
		ms = append(ms, fmt.Sprintf("%d@%s/%s", i+1, n.PeerAddr, n.ClientAddr))
	}
	args := func(id int, bootstrap bool) []string {
		a := append([]string{"--members", strings.Join(ms, ","), "--groups", groups,
			"--replica-id", strconv.Itoa(id), "--cluster-id", "4343", "--cluster-secret", groupsSecret,
			"--bootstrap", strconv.FormatBool(bootstrap)}, extra...)
		if each != nil {
			a = append(a, each(id-1)...)
		}
		return a
	}
	for i, n := range g.Nodes {
		n.Args = args(i+1, true)
		if err := n.StartNoWait(); err != nil {
			t.Fatal(err)
		}
		// Later starts of the same directory must not bootstrap.
		n.Args = args(i+1, false)
	}
	for _, n := range g.Nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatalf("cluster: %s not ready: %v\n%s", n.ID, err, n.Logs())
		}
	}
	return g
}

// Addrs returns the nodes' client addresses.
func (g *Groups) Addrs() []string {
	out := make([]string, len(g.Nodes))
	for i, n := range g.Nodes {
		out[i] = n.ClientAddr
	}
	return out
}

// SlotLeader returns the index of the node that leads the group owning
// slot, as CLUSTER SLOTS at a running node reports it (-1: none known).
func (g *Groups) SlotLeader(slot int) int {
	for _, n := range g.Nodes {
		if !n.Running() {
			continue
		}
		v, err := Command(n.ClientAddr, "CLUSTER", "SLOTS")
		if err != nil || v.Kind != resp.Array {
			continue
		}
		for _, r := range v.Elems {
			if len(r.Elems) < 3 || int(r.Elems[0].Int) > slot || int(r.Elems[1].Int) < slot {
				continue
			}
			m := r.Elems[2] // the master: the group's leader when one is known
			addr := net.JoinHostPort(string(m.Elems[0].Str), strconv.FormatInt(m.Elems[1].Int, 10))
			for i, x := range g.Nodes {
				if x.ClientAddr == addr {
					return i
				}
			}
		}
	}
	return -1
}

// WaitLeaders waits until every group has a leader that every running node
// agrees on (CLUSTER INFO's cluster_state:ok at each).
func (g *Groups) WaitLeaders(timeout time.Duration) {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range g.Nodes {
		for n.Running() {
			v, err := Command(n.ClientAddr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(string(v.Str), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				g.t.Fatalf("cluster: %s knows no leader of some group after %v: %v %s", n.ID, timeout, err, v.Str)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Command sends one command to addr and returns its reply.
func Command(addr string, args ...string) (resp.Value, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return resp.Value{}, err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	if _, err := nc.Write(resp.AppendCommand(nil, bs...)); err != nil {
		return resp.Value{}, err
	}
	return resp.NewReader(nc, 0).ReadValue()
}
