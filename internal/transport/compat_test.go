package transport

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
	"testing"
	"time"
)

// The transport's handshake starts with the node's original peer-port text
// (internal/server/peer.go at commit b229ea6), byte for byte. The two
// functions below are that code, copied (names aside) rather than imported:
// internal/server changes under other hands and will delegate its peer port
// to this package, so the tests must not depend on it building. They run the
// original protocol against the transport in both directions.

var errLegacyAuth = errors.New("peer authentication failed")

const legacyGreeting = "KEFIR-PEER 1"

func legacyMAC(secret, role, nonceA, nonceB, node string) string {
	m := hmac.New(sha256.New, []byte(secret))
	io.WriteString(m, role+"\x00"+nonceA+"\x00"+nonceB+"\x00"+node)
	return hex.EncodeToString(m.Sum(nil))
}

func legacyNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// legacyPeerDial is server.PeerDial.
func legacyPeerDial(addr, nodeID, secret string, timeout time.Duration) (net.Conn, error) {
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
	if len(f) != 3 || f[0]+" "+f[1] != legacyGreeting {
		nc.Close()
		return nil, fmt.Errorf("peer %s: bad greeting %q", addr, line)
	}
	nonceA, nonceB := f[2], legacyNonce()
	fmt.Fprintf(nc, "%s %s %s\n", nodeID, nonceB, legacyMAC(secret, "dial", nonceA, nonceB, nodeID))
	line, err = br.ReadString('\n')
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("peer %s: read verdict: %w", addr, err)
	}
	f = strings.Fields(line)
	if len(f) != 2 || f[0] != "OK" || !hmac.Equal([]byte(f[1]), []byte(legacyMAC(secret, "accept", nonceA, nonceB, nodeID))) {
		nc.Close()
		return nil, fmt.Errorf("%w: %s answered %q", errLegacyAuth, addr, strings.TrimSpace(line))
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// legacyAccept is the server's peerHandshake: it authenticates, reports the
// peer's node id, and closes (the server had no replication yet).
func legacyAccept(nc net.Conn, secret string) (string, error) {
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	nonceA := legacyNonce()
	fmt.Fprintf(nc, "%s %s\n", legacyGreeting, nonceA)
	br := bufio.NewReaderSize(io.LimitReader(nc, 1024), 1024)
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	f := strings.Fields(line)
	if len(f) != 3 || !hmac.Equal([]byte(f[2]), []byte(legacyMAC(secret, "dial", nonceA, f[1], f[0]))) {
		fmt.Fprintf(nc, "ERR authentication failed\n")
		return "", errLegacyAuth
	}
	fmt.Fprintf(nc, "OK %s\n", legacyMAC(secret, "accept", nonceA, f[1], f[0]))
	return f[0], nil
}

func TestTheOriginalPeerDialAuthenticatesAgainstTheTransport(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.HandshakeTimeout = time.Second })
	b := nodes[1]
	// Phase 1 succeeds with both MACs checked: the transport checks the
	// dialer's, the original dialer checks the transport's.
	nc, err := legacyPeerDial(b.ln.Addr().String(), "1", testSecret, 5*time.Second)
	if err != nil {
		t.Fatalf("original PeerDial against the transport: %v", err)
	}
	nc.Close() // a phase-1-only dialer stops here; the transport then refuses it
	eventually(t, 5*time.Second, func() bool { return b.tr.Stats().ProtocolErrors == 1 }, "a protocol error for the phase-1-only dialer")

	if _, err := legacyPeerDial(b.ln.Addr().String(), "1", "wrong", 5*time.Second); !errors.Is(err, errLegacyAuth) {
		t.Fatalf("original PeerDial with the wrong secret: %v, want an authentication failure", err)
	}
	eventually(t, 5*time.Second, func() bool { return b.tr.Stats().AuthFailures == 1 }, "an auth failure counted")
}

func TestTheTransportAuthenticatesAgainstTheOriginalAcceptor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	logs := &logBuf{}
	tr, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: ln.Addr().String()}, ClusterSecret: testSecret, Logger: slogTo(logs), DialBackoff: time.Hour, MaxDialBackoff: time.Hour}, Handler: newInbox().handle})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mustSend(t, tr, 2, msg(1, 2, 1))
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// The original acceptor admits the transport's phase 1 (same text, same
	// MACs) and, not speaking phase 2, closes; the transport says why.
	if node, err := legacyAccept(nc, testSecret); err != nil || node != "1" {
		t.Fatalf("original acceptor: node %q, %v", node, err)
	}
	logs.waitLog(t, "speaks only phase 1", 5*time.Second)
	if s := tr.Stats().Link(2); s.DialFailures != 1 || s.Sent != 0 {
		t.Fatalf("stats %+v: want one failed handshake, nothing sent", s)
	}
}

// Peer protocols 1 (before group-addressed frames), 2 (before one
// connection per node pair) and 3 cannot replicate together: each side
// refuses the other in the handshake and says why, before a frame could be
// misparsed. A protocol-1 dialer sends a four-field IDENT, a protocol-2 one a
// five-field IDENT ending in 2; a protocol-1 or -2 acceptor answers the
// six-field one with "ERR expected IDENT".
func TestAProtocol1PeerIsRefusedWithAClearError(t *testing.T) {
	nodes := cluster(t, 2, nil)
	b := nodes[1]

	// A protocol-1 and a protocol-2 dialer (phase 1 as always, then its IDENT line).
	for i, v := range []struct{ ident, want string }{
		{fmt.Sprintf("IDENT 2 %016x %016x\n", uint64(7), b.tr.cfg.ConfigHash), "peer protocol 1"},
		{fmt.Sprintf("IDENT 2 %016x %016x 2\n", uint64(7), b.tr.cfg.ConfigHash), "peer protocol 2"},
	} {
		nc, err := legacyPeerDial(b.ln.Addr().String(), "1", testSecret, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(nc, v.ident)
		line, err := (&lineReader{r: nc}).line()
		if err != nil || !strings.HasPrefix(line, "ERR ") || !strings.Contains(line, v.want) || !strings.Contains(line, "rolling upgrade") {
			t.Fatalf("the old dialer was told %q (%v), want a refusal naming %s", line, err, v.want)
		}
		eventually(t, 5*time.Second, func() bool { return b.tr.Stats().IdentityRefusals == uint64(i+1) }, "the refusal counted")
	}

	// A protocol-1 acceptor.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	logs := &logBuf{}
	tr, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: ln.Addr().String()}, ClusterSecret: testSecret,
		Logger: slogTo(logs), DialBackoff: time.Hour, MaxDialBackoff: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mustSend(t, tr, 2, msg(1, 2, 1))
	old, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	_ = old.SetDeadline(time.Now().Add(5 * time.Second))
	lr := &lineReader{r: old}
	if _, err := acceptAuth(old, lr, testSecret); err != nil { // phase 1 is the same in both protocols
		t.Fatal(err)
	}
	ident, err := lr.line()
	if f := strings.Fields(ident); err != nil || len(f) != 6 || f[0] != "IDENT" || f[4] != "3" {
		t.Fatalf("IDENT line %q (%v): want the protocol version as the fifth of six fields", ident, err)
	}
	fmt.Fprintf(old, "ERR expected IDENT\n") // what a protocol-1 or -2 acceptor answers a six-field IDENT
	logs.waitLog(t, "peer protocol 1", 5*time.Second)
	if s := tr.Stats().Link(2); s.Sent != 0 {
		t.Fatalf("stats %+v: nothing may be sent to a protocol-1 peer", s)
	}
}
