package transport

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
)

// clusterTLS is a throwaway cluster certificate for 127.0.0.1 that every
// node presents and trusts (a cluster CA of one).
func clusterTLS(t *testing.T) *tls.Config {
	t.Helper()
	cert, pool := testgroup.LoopbackCert(t)
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool, // dialer verifies the acceptor
		ClientCAs:    pool, // acceptor verifies the dialer
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   "127.0.0.1",
		MinVersion:   tls.VersionTLS13,
	}
}

func TestTLSCarriesTheHandshakeAndMessages(t *testing.T) {
	cfg := clusterTLS(t)
	nodes := cluster(t, 2, func(c *vrConfig) { c.TLS = cfg })
	for op := uint64(1); op <= 100; op++ {
		mustSend(t, nodes[0].tr, 2, msg(1, 2, op))
	}
	for i, g := range nodes[1].in.wait(t, 100, 10*time.Second) {
		if g.m.Op != uint64(i+1) {
			t.Fatalf("message %d has op %d", i, g.m.Op)
		}
	}
}

func TestAPlaintextPeerCannotReachATLSNode(t *testing.T) {
	cfg := clusterTLS(t)
	nodes := cluster(t, 2, func(c *vrConfig) {
		// Each side waits for the other to speak first (greeting vs
		// ClientHello) until the handshake timeout.
		c.HandshakeTimeout = 200 * time.Millisecond
		if c.Self == 2 {
			c.TLS = cfg
		}
	})
	mustSend(t, nodes[0].tr, 2, msg(1, 2, 1))
	nodes[1].log.waitLog(t, "TLS handshake failed", 5*time.Second)
	if nodes[1].in.count() != 0 {
		t.Fatal("a plaintext peer's message reached a TLS node")
	}
}
