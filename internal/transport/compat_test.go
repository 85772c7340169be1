package transport_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

// The transport's handshake starts with the node's peer-port text
// (internal/server/peer.go) byte for byte. These tests run the real server
// code against the transport, both ways, so a change on either side that
// breaks the shared phase shows up here.

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServerPeerDialAuthenticatesAgainstTheTransport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	tr, err := transport.New(transport.Config{Self: 1, Peers: map[uint64]string{2: "127.0.0.1:1"}, ClusterSecret: "cluster",
		Handler: func(uint64, []vr.Message) {}, Logger: slog.New(slog.NewTextHandler(logs, nil)), HandshakeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	go tr.Serve(ln)

	// Phase 1 (the server's handshake) succeeds in both directions' MACs:
	// the transport checks the dialer's, PeerDial checks the transport's.
	nc, err := server.PeerDial(ln.Addr().String(), "2", "cluster", 5*time.Second)
	if err != nil {
		t.Fatalf("server.PeerDial against the transport: %v", err)
	}
	nc.Close() // a phase-1-only dialer stops here; the transport then refuses it
	waitFor(t, "a protocol error for the phase-1-only dialer", func() bool { return tr.Stats().ProtocolErrors == 1 })

	if _, err := server.PeerDial(ln.Addr().String(), "2", "wrong", 5*time.Second); !errors.Is(err, server.ErrPeerAuth) {
		t.Fatalf("PeerDial with the wrong secret: %v, want ErrPeerAuth", err)
	}
	waitFor(t, "an auth failure counted", func() bool { return tr.Stats().AuthFailures == 1 })
}

func TestTransportAuthenticatesAgainstTheServerPeerPort(t *testing.T) {
	srvLogs := &syncBuf{}
	s, err := server.New(server.Config{ClientAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0",
		ClusterSecret: "cluster", DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(srvLogs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logs := &syncBuf{}
	tr, err := transport.New(transport.Config{Self: 1, Peers: map[uint64]string{2: s.PeerAddr().String()}, ClusterSecret: "cluster",
		Handler: func(uint64, []vr.Message) {}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	_ = tr.Send(2, &vr.Message{Type: vr.MsgCommit, From: 1, To: 2})
	// The server accepts the transport's phase 1 (same text, same MACs) and,
	// not speaking phase 2 yet, closes; the transport reports why.
	waitFor(t, "the server to authenticate the transport", func() bool { return strings.Contains(srvLogs.String(), "peer authenticated") })
	waitFor(t, "the transport to count the failed handshake", func() bool { return tr.Stats().Link(2).DialFailures > 0 })
	waitFor(t, "the transport to log the phase-1-only peer", func() bool { return strings.Contains(logs.String(), "speaks only phase 1") })
}
