package server

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kefirdb/kefir/internal/transport"
)

// The peer port admits only processes that know the cluster secret: the
// transport's challenge-response handshake (internal/transport/handshake.go),
// in which neither side reveals the secret and fresh nonces defeat replays. A
// replica group hands each connection to its transport, which adds the
// identity phase and then runs replication; a single node runs only the
// authentication phase and closes.
//
// A replicated node owns its peer transport (openReplica creates it; the
// replica of each group the node hosts registers its group on it), and the
// peer port hands every connection to it: one connection per peer node,
// shared by all groups.

// ErrPeerAuth is returned when a peer handshake fails authentication.
var ErrPeerAuth = transport.ErrAuth

// PeerDial connects to a peer port and authenticates with secret as nodeID
// (the authentication phase only).
func PeerDial(addr, nodeID, secret string, timeout time.Duration) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("peer dial %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if err := transport.DialAuth(nc, secret, nodeID); err != nil {
		nc.Close()
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

func (s *Server) servePeers() {
	for {
		nc, err := s.peerLn.Accept()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if s.peerTr != nil {
			// The transport runs the same handshake (plus the peer protocol,
			// cluster id and configuration hash) and then carries every
			// hosted group's messages.
			go s.peerTr.HandleConn(nc)
			continue
		}
		go s.peerHandshake(nc)
	}
}

// peerHandshake authenticates an incoming peer of a single node, which runs no
// replication: an authenticated peer is logged and its connection closed.
func (s *Server) peerHandshake(nc net.Conn) {
	defer nc.Close()
	log := s.log.With("peer_remote", nc.RemoteAddr().String())
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if s.cfg.ClusterSecret == "" {
		// Loopback-only and no secret: Validate allowed it, but refuse rather than
		// accept unauthenticated peers.
		fmt.Fprintf(nc, "ERR this node has no cluster secret; peers are refused\n")
		log.Warn("peer refused: no cluster secret configured")
		return
	}
	node, err := transport.AcceptAuth(nc, s.cfg.ClusterSecret)
	if errors.Is(err, transport.ErrAuth) {
		log.Warn("peer authentication failed (wrong cluster secret or not a Kefir node)")
		return
	}
	if err != nil {
		log.Info("peer handshake aborted", "err", err)
		return
	}
	log.Info("peer authenticated; this node runs no replication, closing", "peer_node", node)
}
