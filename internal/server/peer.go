package server

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// The peer port admits only processes that know the cluster secret. The handshake
// is a challenge-response both ways, so neither side reveals the secret and a
// recorded handshake cannot be replayed (fresh nonces):
//
//	acceptor → dialer:  "KEFIR-PEER 1 <nonceA>\n"
//	dialer → acceptor:  "<nodeID> <nonceB> <hex HMAC(secret, "dial" nonceA nonceB nodeID)>\n"
//	acceptor → dialer:  "OK <hex HMAC(secret, "accept" nonceA nonceB nodeID)>\n"  or "ERR ...\n" and close
//
// Replication (issue 4+) will run its protocol on the connection after "OK".

// ErrPeerAuth is returned when a peer handshake fails authentication.
var ErrPeerAuth = errors.New("peer authentication failed")

const peerGreeting = "KEFIR-PEER 1"

func peerMAC(secret, role, nonceA, nonceB, node string) string {
	m := hmac.New(sha256.New, []byte(secret))
	io.WriteString(m, role+"\x00"+nonceA+"\x00"+nonceB+"\x00"+node)
	return hex.EncodeToString(m.Sum(nil))
}

func nonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// PeerDial connects to a peer port and authenticates with secret as nodeID.
func PeerDial(addr, nodeID, secret string, timeout time.Duration) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("peer dial %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(timeout))
	br := bufio.NewReader(nc)
	line, err := br.ReadString('\n')
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("peer %s: read greeting: %w", addr, err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0]+" "+f[1] != peerGreeting {
		nc.Close()
		return nil, fmt.Errorf("peer %s: bad greeting %q", addr, line)
	}
	nonceA, nonceB := f[2], nonce()
	fmt.Fprintf(nc, "%s %s %s\n", nodeID, nonceB, peerMAC(secret, "dial", nonceA, nonceB, nodeID))
	line, err = br.ReadString('\n')
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("peer %s: read verdict: %w", addr, err)
	}
	f = strings.Fields(line)
	if len(f) != 2 || f[0] != "OK" || !hmac.Equal([]byte(f[1]), []byte(peerMAC(secret, "accept", nonceA, nonceB, nodeID))) {
		nc.Close()
		return nil, fmt.Errorf("%w: %s answered %q", ErrPeerAuth, addr, strings.TrimSpace(line))
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
		if s.vr != nil {
			// The transport runs the same handshake (plus the cluster id and
			// configuration hash) and then the replication protocol.
			go s.vr.Transport().HandleConn(nc)
			continue
		}
		go s.peerHandshake(nc)
	}
}

// peerHandshake authenticates an incoming peer. With no replication yet, an
// authenticated peer is logged and its connection closed.
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
	nonceA := nonce()
	fmt.Fprintf(nc, "%s %s\n", peerGreeting, nonceA)
	br := bufio.NewReaderSize(io.LimitReader(nc, 1024), 1024)
	line, err := br.ReadString('\n')
	if err != nil {
		log.Info("peer handshake aborted", "err", err)
		return
	}
	f := strings.Fields(line)
	if len(f) != 3 || !hmac.Equal([]byte(f[2]), []byte(peerMAC(s.cfg.ClusterSecret, "dial", nonceA, f[1], f[0]))) {
		fmt.Fprintf(nc, "ERR authentication failed\n")
		log.Warn("peer authentication failed (wrong cluster secret or not a Kefir node)")
		return
	}
	fmt.Fprintf(nc, "OK %s\n", peerMAC(s.cfg.ClusterSecret, "accept", nonceA, f[1], f[0]))
	log.Info("peer authenticated; replication is not enabled in this build, closing", "peer_node", f[0])
}
