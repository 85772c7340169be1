package cluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
)

// zoneRecorder records a node's own zone (kefir server --zone) in the
// metadata group's map: the node is the one that knows where it runs, and
// a node enters the map in many ways (the first map from --members, add-node,
// replace-node --new, kefir up), none of which needs to carry the zone. So
// while the map this node follows has it with another zone, its follower
// asks the metadata group to record --zone (KEFIR.SLOTS META ADDNODE with
// the map's addresses for it and ZONE: a node of the map at the same
// addresses gets the zone, a retry is a no-op), one ask at a time, the
// next not before zoneRecheck (the map this node follows learns the
// zone a poll later) or, after a failure, zoneRetry, nor, after an
// answered ask, before that map reaches the epoch that has the zone (at
// a move's end; until). The flag wins: a node restarted with
// another --zone (moved to another rack) records the new one; a zone set by
// add-node --zone for a node started with another --zone does not stay.
// Placement reads the zone from the map from then on; replicas placed
// before stay where they are (kefir cluster status flags a group whose
// replicas share a zone).
type zoneRecorder struct {
	mu   sync.Mutex
	busy bool      // an ask in flight
	next time.Time // no ask before
	// until: after an ask the metadata group answered, the epoch from
	// which the map this node follows has the zone; no ask while it is
	// below, until stale. A move in flight keeps the epoch where it is
	// (kv's KindMapAddNode), and a node that polls the map adopts only a
	// newer one: without this it would ask every zoneRecheck until the
	// move's end, each ask a no-op op in the metadata group's log.
	until uint64
	stale time.Time
	wg    sync.WaitGroup
}

// zoneRecheck is how long the recorder waits after an ask the metadata
// group answered before it asks again, should the map this node follows
// still lack the zone; zoneRetry after a failed ask (an older metadata
// leader, which does not know zones, refuses every one).
const (
	zoneRecheck = 2 * time.Second
	zoneRetry   = 10 * time.Second
	// zoneStale bounds the wait for the epoch an answered ask named
	// (until): should the map this node follows not reach it (a move
	// that does not end), the recorder asks again after this long.
	zoneStale = time.Minute
)

// tick starts an ask if this node's map entry lacks cfg.Zone.
func (z *zoneRecorder) tick(ctx context.Context, m *Multi, cfg FollowConfig) {
	cm := m.ClusterMap()
	if cfg.Zone == "" || cm == nil {
		return
	}
	i := slices.IndexFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == m.self })
	if i < 0 || cm.Nodes[i].Zone == cfg.Zone {
		return // not in the map (yet, or retired), or recorded
	}
	nd := cm.Nodes[i]
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.busy || time.Now().Before(z.next) || (cm.Epoch < z.until && time.Now().Before(z.stale)) {
		return
	}
	z.busy = true
	seeds, seen := m.metaSeeds(), cm.Epoch
	z.wg.Add(1)
	go func() {
		defer z.wg.Done()
		mv := &Mover{Seeds: seeds, Password: cfg.Password, TLS: cfg.TLS, RetryFor: 2 * time.Second}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		epoch, err := mv.AddNode(actx, nd.ID, nd.ClientAddr, nd.PeerAddr, cfg.Zone)
		cancel()
		z.mu.Lock()
		z.busy = false
		z.next = time.Now().Add(zoneRecheck)
		// The answer's epoch has the zone when the group moved it; when
		// it did not (a move in flight: the answer is the epoch this node
		// has already, or the map it will poll next), the zone comes
		// with the next one.
		z.until, z.stale = max(epoch, seen+1), time.Now().Add(zoneStale)
		if err != nil {
			z.next, z.until = time.Now().Add(zoneRetry), 0
		}
		z.mu.Unlock()
		if cfg.Logf == nil || ctx.Err() != nil {
			return
		}
		if err != nil {
			cfg.Logf("metadata: record this node's zone %s in the map (it has %q): %v (tried again in %v)", cfg.Zone, nd.Zone, err, zoneRetry)
			return
		}
		cfg.Logf("metadata: this node's zone %s is in the map at epoch %d", cfg.Zone, epoch)
	}()
}
