package server

import (
	"context"
	"errors"
	"strconv"

	"github.com/kefirdb/kefir/internal/cluster"
)

// CRAQ's version query between a chain's members (docs/design/chain.md,
// "The version query"): a member where a key read is dirty asks the tail,
// at its front door, for its commit point (KEFIR.CHAINVERSION group epoch,
// over the router's forwarding connections: the same address book, AUTH
// and TLS as a forwarded read), and answers the read from its own engine.
// The front door, not the group's peer transport: an older tail answers
// "unknown command" and the member forwards the read whole, where an
// unknown message type on the peer link would fail the link the chain's
// updates travel on.

// chainVersioner is a replica that answers the version query (vrshard).
type chainVersioner interface {
	ChainVersion(epoch uint64) (uint64, error)
}

// chainVersion answers KEFIR.CHAINVERSION group epoch: this node's member
// of chain group (0: the node's only group), if it is the tail in epoch
// under its lease, answers its commit point.
func (c *conn) chainVersion(args [][]byte) error {
	g, err1 := strconv.ParseUint(string(args[1]), 10, 32)
	epoch, err2 := strconv.ParseUint(string(args[2]), 10, 64)
	if err1 != nil || err2 != nil {
		return errf("ERR KEFIR.CHAINVERSION group epoch: both unsigned integers")
	}
	rep := any(c.srv.shard)
	if c.srv.multi != nil {
		lg, ok := c.srv.hostedGroup(cluster.GroupID(g))
		if !ok {
			return errf("ERR KEFIR.CHAINVERSION: this node hosts no member of group %d", g)
		}
		rep = lg.Hosted.Replica
	}
	vq, ok := rep.(chainVersioner)
	if !ok {
		return errf("ERR KEFIR.CHAINVERSION: group %d is not a chain on this node", g)
	}
	v, err := vq.ChainVersion(epoch)
	if err != nil {
		return errf("ERR KEFIR.CHAINVERSION: %v", err)
	}
	return c.w.WriteInt(int64(v))
}

// askTail is the node's chain members' version query (cluster.ReplicaSpec.AskTail).
func (s *Server) askTail(ctx context.Context, addr string, group cluster.GroupID, epoch uint64) (uint64, error) {
	r := s.router
	if r == nil {
		return 0, errors.New("no router yet")
	}
	return r.AskChainVersion(ctx, addr, group, epoch)
}
