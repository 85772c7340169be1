package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// Placement by failure domains (docs/cluster.md, "Failure domains"): five
// nodes started with --zone a, b, c, a, c record their zones in the map
// themselves; group 1 on 1-3 (a, b, c), group 2 on 3-5 (c, a, c — two in
// c: kefir cluster status flags it), the metadata group on 1-3. Node 3
// (zone c) is SIGKILLed and the repairer (--repair-after 3s) re-creates
// its replicas by zone before load: group 1 takes node 5 (c, the zone it
// lost) rather than node 4 (a, as lightly loaded, a lower id — the choice
// without zones), group 2 takes node 2 (b, the one zone it lacks) rather
// than node 1 (a), and the metadata group node 5 (c). Status then flags
// no group. A node's HTTP /status shows the zones and the flag as well.
func TestGroupsRepairPlacesInTheMissingZone(t *testing.T) {
	zones := []string{"a", "b", "c", "a", "c"}
	g := cluster.StartGroupsEach(t, 5, "1=1,2,3:0-8191;2=3,4,5:8192-16383",
		func(i int) []string { return []string{"--zone", zones[i]} }, "--repair-after", "3s")
	g.WaitLeaders(20 * time.Second)
	var cm *kv.ClusterMap
	if !testgroup.Until(20*time.Second, 100*time.Millisecond, func() bool {
		cm = localMap(g.Nodes[0].ClientAddr)
		if cm == nil || len(cm.Nodes) != 5 {
			return false
		}
		for i, n := range cm.Nodes {
			if n.Zone != zones[i] {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the nodes' zones are not in node 1's map: %+v", cm)
	}
	addr := "--addr=" + g.Nodes[0].ClientAddr + "," + g.Nodes[1].ClientAddr
	out, err := kefirCluster(t, "status", addr)
	if err != nil || !strings.Contains(out, "zone c") || !strings.Contains(out, "REPLICAS SHARE A ZONE (zone c: nodes 3, 5)") {
		t.Fatalf("status before the failure: %v\n%s", err, out)
	}
	// The HTTP status of node 4 (no metadata replica: it polls the map)
	// has the zones and the flag too.
	var st struct {
		ClusterMap struct {
			Zones       map[uint64]string `json:"zones"`
			SharedZones map[uint64]string `json:"shared_zones"`
		} `json:"cluster_map"`
	}
	if !testgroup.Until(10*time.Second, 100*time.Millisecond, func() bool {
		r, err := (&http.Client{Timeout: time.Second}).Get("http://" + g.Nodes[3].HTTPAddr + "/status")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		return json.NewDecoder(r.Body).Decode(&st) == nil && len(st.ClusterMap.Zones) == 5 && st.ClusterMap.Zones[5] == "c" &&
			st.ClusterMap.SharedZones[2] == "zone c: nodes 3, 5" && len(st.ClusterMap.SharedZones) == 1
	}) {
		t.Fatalf("node 4's /status cluster_map: %+v", st.ClusterMap)
	}
	g.Nodes[2].Kill()
	want := map[uint64][]uint64{1: {1, 2, 5}, 2: {2, 4, 5}, kv.MetaGroup: {1, 2, 5}}
	if !testgroup.Until(60*time.Second, 200*time.Millisecond, func() bool {
		cm = localMap(g.Nodes[0].ClientAddr)
		if cm == nil {
			return false
		}
		for id, ms := range want {
			got := cm.MetaMembers()
			if id != kv.MetaGroup {
				mg, ok := cm.Group(id)
				if !ok {
					return false
				}
				got = mg.Members
			}
			if !slices.Equal(sortedIDs(got), ms) {
				return false
			}
		}
		return true
	}) {
		var logs string
		for _, n := range g.Nodes {
			logs += n.Logs()
		}
		t.Fatalf("node 3's replicas not re-created by zone: map %+v, want %v\n%s", cm, want, logs)
	}
	out, err = kefirCluster(t, "status", addr)
	if err != nil || strings.Contains(out, "SHARE A ZONE") {
		t.Fatalf("status after the repair: %v\n%s", err, out)
	}
	t.Logf("status after the repair:\n%s", out)
}
