package transport

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// The handshake, in two phases. Phase 1 is the node's original peer-port
// text (internal/server/peer.go), byte for byte, so a process that only knows
// phase 1 still authenticates against us and we against it:
//
//	acceptor → dialer:  "KEFIR-PEER 1 <nonceA>\n"
//	dialer → acceptor:  "<nodeID> <nonceB> <hex HMAC(secret, "dial" nonceA nonceB nodeID)>\n"
//	acceptor → dialer:  "OK <hex HMAC(secret, "accept" nonceA nonceB nodeID)>\n"  or "ERR ...\n" and close
//
// Both sides prove the cluster secret without revealing it, and fresh nonces
// make a recorded handshake useless for replay. The HMAC input joins its
// parts with NUL bytes.
//
// Phase 2 (transport identity) follows "OK" on the same connection:
//
//	dialer → acceptor:  "IDENT <to> <cluster> <confighash> <protocol> <incarnation>\n"
//	acceptor → dialer:  "READY <self> <cluster> <confighash> <protocol> <incarnation>\n"  or "ERR <reason>\n" and close
//
// nodeID, to and self are decimal node ids, cluster, confighash and
// incarnation are 16-digit hex, protocol is the decimal peer protocol version
// (Protocol). The incarnation is a random number a transport draws at New: a
// different one from the same node id means the node restarted, so a
// connection from its earlier incarnation is dead (half-open) whichever side
// dialed it (peer.beatsLocked).
//
// After READY both sides write frames (internal/frame): one connection
// carries a pair of nodes' traffic both ways. Both nodes may dial at once;
// the acceptor refuses a dial that its current connection to the dialer
// beats with "ERR duplicate ..." (errDuplicate; the dialer then uses that
// connection, which reaches it as an inbound one); it makes a dial it takes
// the pair's connection before READY goes out (peer.accept), so the dialer's
// next dial can never be taken before it. A connection that lost the race
// after READY is closed by whichever side sees it lose (peer.adopt). The rule is the same on both sides, so they keep the same
// connection: the one dialed by the lower node id, unless the node that holds
// it has restarted since.
//
// Versions: protocol 1 had no protocol field (its IDENT and READY lines have
// four fields) and frames without a group envelope; protocol 2 had the
// envelope but no incarnation (five fields) and two connections per pair,
// one per direction, the acceptor never writing after READY. Neither is
// compatible with 3, so each side refuses the other in the handshake with an
// error that says so, before any frame could be misparsed: a rolling upgrade
// across either change is not possible (stop every node, upgrade, start).
// The acceptor refuses a dialer of another protocol, whose id is not in its
// peer list, who meant to reach another node (<to> is not the acceptor's id:
// the dialer's peer list maps this address to the wrong node), or whose
// cluster or configuration hash differs (a different member list or epoch).
// The dialer checks the same in the READY line.
//
// Phase 2 is not authenticated separately: the phase-1 MACs prove who is at
// the other end; an attacker who can rewrite bytes in flight can also hijack
// the connection after the handshake, which only TLS (Config.TLS) prevents.

// Protocol is the peer protocol version this node speaks after the
// handshake: 2 was group-addressed frames (internal/frame) on one connection
// per direction; 3 is the same frames on one connection per node pair, with
// the incarnation in the handshake.
const Protocol = 3

// oldProtocol explains a refusal by, or of, a peer of peer protocol 1.
const oldProtocol = "the peer speaks peer protocol 1 (a Kefir version from before group-addressed frames), this node speaks protocol 3; they cannot replicate together: upgrade every node of the cluster together (a rolling upgrade across this change is not possible)"

// olderProtocol explains a refusal by a peer of an older protocol that
// cannot tell which (a protocol-1 or -2 acceptor answers our IDENT line,
// which has more fields than it knows, with "ERR expected IDENT").
const olderProtocol = "the peer speaks peer protocol 1 or 2 (a Kefir version from before one connection per node pair), this node speaks protocol 3; they cannot replicate together: upgrade every node of the cluster together (a rolling upgrade across this change is not possible)"

// protocolMismatch explains a refusal of a peer that states protocol v.
func protocolMismatch(node, v string) string {
	if v == "2" {
		return fmt.Sprintf("node %s speaks peer protocol 2 (a Kefir version from before one connection per node pair), this node speaks protocol %d; they cannot replicate together: upgrade every node of the cluster together (a rolling upgrade across this change is not possible)", node, Protocol)
	}
	return fmt.Sprintf("node %s speaks peer protocol %q, this node %d", node, v, Protocol)
}

// duplicatePrefix starts the acceptor's refusal of a dial that its current
// connection to the dialer beats (errDuplicate).
const duplicatePrefix = "ERR duplicate"

// errDuplicate: the acceptor already holds a connection to us that beats the
// one we dialed (a dial race); we are to use that one. Not a failure.
var errDuplicate = errors.New("transport: the peer keeps the connection it holds with us")

const (
	greeting = "KEFIR-PEER 1"
	// maxLine bounds a handshake line, so a peer that never sends a newline
	// cannot make us buffer without limit.
	maxLine = 512
)

// Sentinel errors for handshake failures; wrapped with the details.
var (
	// ErrAuth: the other side does not know the cluster secret (or is not a
	// Kefir node).
	ErrAuth = errors.New("transport: peer authentication failed")
	// ErrIdentity: the other side authenticated but its node id, cluster or
	// configuration does not match ours.
	ErrIdentity = errors.New("transport: peer identity or configuration mismatch")
	// ErrProtocol: the other side does not speak the handshake (garbage,
	// truncated lines, or only phase 1).
	ErrProtocol = errors.New("transport: peer handshake protocol error")
)

// Identity is what a node says about itself in phase 2.
type Identity struct {
	Node       uint64
	Cluster    uint64
	ConfigHash uint64
}

func (id Identity) String() string {
	return fmt.Sprintf("node %d cluster %016x config %016x", id.Node, id.Cluster, id.ConfigHash)
}

func peerMAC(secret, role, nonceA, nonceB, node string) string {
	m := hmac.New(sha256.New, []byte(secret))
	_, _ = io.WriteString(m, role+"\x00"+nonceA+"\x00"+nonceB+"\x00"+node)
	return hex.EncodeToString(m.Sum(nil))
}

func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (Go ≥ 1.24 panics instead)
	return hex.EncodeToString(b[:])
}

// lineReader reads handshake lines without reading past them, except for
// bytes that arrive in the same segment; those are returned by rest so the
// frame reader starts with them.
type lineReader struct {
	r   io.Reader
	buf []byte
}

func (l *lineReader) line() (string, error) {
	for {
		if i := bytes.IndexByte(l.buf, '\n'); i >= 0 {
			s := string(l.buf[:i])
			l.buf = l.buf[i+1:]
			return s, nil
		}
		if len(l.buf) >= maxLine {
			return "", fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, maxLine)
		}
		var chunk [maxLine]byte
		n, err := l.r.Read(chunk[:maxLine-len(l.buf)])
		l.buf = append(l.buf, chunk[:n]...)
		if err != nil && n == 0 {
			if errors.Is(err, io.EOF) {
				return "", fmt.Errorf("%w: connection closed mid-handshake", ErrProtocol)
			}
			return "", err
		}
	}
}

func (l *lineReader) rest() []byte { return l.buf }

// refusal turns an "ERR ..." line into an error of class err.
func refusal(line string, class error) error {
	if reason, ok := strings.CutPrefix(line, "ERR "); ok {
		return fmt.Errorf("%w: refused: %s", class, reason)
	}
	return fmt.Errorf("%w: unexpected line %q", ErrProtocol, line)
}

// dialHandshake authenticates nc (already connected to the node we think is
// `to`) as self, of incarnation inc, and returns the acceptor's incarnation
// and any frame bytes that arrived with READY (the acceptor may write frames
// right after it).
func dialHandshake(nc net.Conn, secret string, self Identity, inc uint64, to uint64) (uint64, []byte, error) {
	return dialHandshakeCfg(nc, secret, self, inc, to, nil)
}

// dialHandshakeCfg is dialHandshake with a configuration rule: cfgOK, if
// not nil, may admit an acceptor whose configuration hash differs from
// self's (Transport.AdmitConfigs).
func dialHandshakeCfg(nc net.Conn, secret string, self Identity, inc uint64, to uint64, cfgOK func(node, hash uint64) bool) (uint64, []byte, error) {
	lr := &lineReader{r: nc}
	if err := dialAuth(nc, lr, secret, strconv.FormatUint(self.Node, 10)); err != nil {
		return 0, nil, err
	}
	var line string
	var err error
	if _, err := fmt.Fprintf(nc, "IDENT %d %016x %016x %d %016x\n", to, self.Cluster, self.ConfigHash, Protocol, inc); err != nil {
		return 0, nil, fmt.Errorf("send identity: %w", err)
	}
	if line, err = lr.line(); err != nil {
		return 0, nil, fmt.Errorf("read identity verdict (a peer that closes here speaks only phase 1): %w", err)
	}
	f := strings.Fields(line)
	switch {
	case line == "ERR expected IDENT":
		// A protocol-1 or -2 acceptor's answer to an IDENT line with more
		// fields than it knows.
		return 0, nil, fmt.Errorf("%w: refused: %s", ErrIdentity, olderProtocol)
	case strings.HasPrefix(line, duplicatePrefix):
		return 0, nil, fmt.Errorf("%w (%s)", errDuplicate, line)
	case len(f) == 4 && f[0] == "READY":
		return 0, nil, fmt.Errorf("%w: %s", ErrIdentity, oldProtocol)
	case len(f) == 5 && f[0] == "READY":
		return 0, nil, fmt.Errorf("%w: %s", ErrIdentity, protocolMismatch("the acceptor", f[4]))
	case len(f) != 6 || f[0] != "READY":
		return 0, nil, refusal(line, ErrIdentity)
	}
	if f[4] != strconv.Itoa(Protocol) {
		return 0, nil, fmt.Errorf("%w: %s", ErrIdentity, protocolMismatch("the acceptor", f[4]))
	}
	them, err := parseIdentity(f[1], f[2], f[3])
	if err != nil {
		return 0, nil, err
	}
	want := Identity{Node: to, Cluster: self.Cluster, ConfigHash: self.ConfigHash}
	if them != want && (them.Node != want.Node || them.Cluster != want.Cluster || cfgOK == nil || !cfgOK(them.Node, them.ConfigHash)) {
		return 0, nil, fmt.Errorf("%w: expected %v, the acceptor is %v", ErrIdentity, want, them)
	}
	theirInc, err := strconv.ParseUint(f[5], 16, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: bad incarnation %q", ErrProtocol, f[5])
	}
	return theirInc, lr.rest(), nil
}

// dialAuth is phase 1 on the dialing side: prove the cluster secret as node and
// check that the acceptor knows it too.
func dialAuth(nc net.Conn, lr *lineReader, secret, node string) error {
	line, err := lr.line()
	if err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0]+" "+f[1] != greeting {
		if strings.HasPrefix(line, "ERR ") {
			return refusal(line, ErrAuth)
		}
		return fmt.Errorf("%w: bad greeting %q", ErrProtocol, line)
	}
	nonceA, nonceB := f[2], newNonce()
	if _, err := fmt.Fprintf(nc, "%s %s %s\n", node, nonceB, peerMAC(secret, "dial", nonceA, nonceB, node)); err != nil {
		return fmt.Errorf("send credentials: %w", err)
	}
	if line, err = lr.line(); err != nil {
		return fmt.Errorf("read verdict: %w", err)
	}
	f = strings.Fields(line)
	if len(f) != 2 || f[0] != "OK" {
		return refusal(line, ErrAuth)
	}
	if !hmac.Equal([]byte(f[1]), []byte(peerMAC(secret, "accept", nonceA, nonceB, node))) {
		return fmt.Errorf("%w: the acceptor does not know our cluster secret", ErrAuth)
	}
	return nil
}

// acceptAuth is phase 1 on the accepting side: greet, check the dialer's proof
// of the cluster secret, and prove ours. It returns the node name the dialer gave.
func acceptAuth(nc net.Conn, lr *lineReader, secret string) (string, error) {
	nonceA := newNonce()
	if _, err := fmt.Fprintf(nc, "%s %s\n", greeting, nonceA); err != nil {
		return "", fmt.Errorf("send greeting: %w", err)
	}
	line, err := lr.line()
	if err != nil {
		return "", fmt.Errorf("read credentials: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || !hmac.Equal([]byte(f[2]), []byte(peerMAC(secret, "dial", nonceA, f[1], f[0]))) {
		_, _ = fmt.Fprintf(nc, "ERR authentication failed\n")
		return "", fmt.Errorf("%w: wrong cluster secret or not a Kefir node", ErrAuth)
	}
	nonceB, node := f[1], f[0]
	if _, err := fmt.Fprintf(nc, "OK %s\n", peerMAC(secret, "accept", nonceA, nonceB, node)); err != nil {
		return "", fmt.Errorf("send verdict: %w", err)
	}
	return node, nil
}

// DialAuth runs only phase 1 of the handshake as node on an open connection: for
// tools and for nodes without replication, which authenticate peers but run no
// protocol after it.
func DialAuth(nc net.Conn, secret, node string) error {
	return dialAuth(nc, &lineReader{r: nc}, secret, node)
}

// AcceptAuth runs only phase 1 of the handshake on the accepting side and returns
// the dialer's node name; see DialAuth.
func AcceptAuth(nc net.Conn, secret string) (string, error) {
	return acceptAuth(nc, &lineReader{r: nc}, secret)
}

func parseIdentity(node, cluster, hash string) (Identity, error) {
	var id Identity
	var err1, err2, err3 error
	id.Node, err1 = strconv.ParseUint(node, 10, 64)
	id.Cluster, err2 = strconv.ParseUint(cluster, 16, 64)
	id.ConfigHash, err3 = strconv.ParseUint(hash, 16, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Identity{}, fmt.Errorf("%w: bad identity fields: %v", ErrProtocol, err)
	}
	return id, nil
}

// acceptHandshake authenticates the dialer on nc and returns its node id, its
// incarnation and any frame bytes that arrived with the last handshake line.
// known reports whether a node id is in our peer list; admit, if not nil, is
// asked last whether to take a connection from that node and incarnation
// (false: our current connection to it beats this one, and the dialer is
// told to use that: "ERR duplicate"). On failure the dialer has been told why
// (an "ERR" line) where the protocol allows it.
func acceptHandshake(nc net.Conn, secret string, self Identity, inc uint64, known func(uint64) bool, admit func(node, inc uint64) bool) (uint64, uint64, []byte, error) {
	return acceptHandshakeCfg(nc, secret, self, inc, known, admit, nil)
}

// acceptHandshakeCfg is acceptHandshake with a configuration rule: cfgOK,
// if not nil, may admit a dialer whose configuration hash differs from
// self's (Transport.AdmitConfigs).
func acceptHandshakeCfg(nc net.Conn, secret string, self Identity, inc uint64, known func(uint64) bool, admit func(node, inc uint64) bool, cfgOK func(node, hash uint64) bool) (uint64, uint64, []byte, error) {
	lr := &lineReader{r: nc}
	node, err := acceptAuth(nc, lr, secret)
	if err != nil {
		return 0, 0, nil, err
	}
	var line string
	if line, err = lr.line(); err != nil {
		return 0, 0, nil, fmt.Errorf("read identity of authenticated node %q (phase-1-only peer?): %w", node, err)
	}
	f := strings.Fields(line)
	if len(f) == 4 && f[0] == "IDENT" {
		_, _ = fmt.Fprintf(nc, "ERR %s\n", oldProtocol)
		return 0, 0, nil, fmt.Errorf("%w: node %s: %s", ErrIdentity, node, oldProtocol)
	}
	if len(f) == 5 && f[0] == "IDENT" {
		reason := protocolMismatch(node, f[4])
		_, _ = fmt.Fprintf(nc, "ERR %s\n", reason)
		return 0, 0, nil, fmt.Errorf("%w: %s", ErrIdentity, reason)
	}
	if len(f) != 6 || f[0] != "IDENT" {
		_, _ = fmt.Fprintf(nc, "ERR expected IDENT\n")
		return 0, 0, nil, fmt.Errorf("%w: expected IDENT, got %q", ErrProtocol, line)
	}
	if f[4] != strconv.Itoa(Protocol) {
		reason := protocolMismatch(node, f[4])
		_, _ = fmt.Fprintf(nc, "ERR %s\n", reason)
		return 0, 0, nil, fmt.Errorf("%w: %s", ErrIdentity, reason)
	}
	them, err := parseIdentity(node, f[2], f[3])
	if err != nil {
		_, _ = fmt.Fprintf(nc, "ERR %v\n", err)
		return 0, 0, nil, err
	}
	to, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		_, _ = fmt.Fprintf(nc, "ERR bad target node id %q\n", f[1])
		return 0, 0, nil, fmt.Errorf("%w: bad target node id %q", ErrProtocol, f[1])
	}
	theirInc, err := strconv.ParseUint(f[5], 16, 64)
	if err != nil {
		_, _ = fmt.Fprintf(nc, "ERR bad incarnation %q\n", f[5])
		return 0, 0, nil, fmt.Errorf("%w: bad incarnation %q", ErrProtocol, f[5])
	}
	var reason string
	switch {
	case to != self.Node:
		reason = fmt.Sprintf("node %d dialed this address as node %d, but this is node %d (peer lists disagree)", them.Node, to, self.Node)
	case them.Node == self.Node || !known(them.Node):
		reason = fmt.Sprintf("node %d is not in node %d's peer list", them.Node, self.Node)
	case them.Cluster != self.Cluster:
		reason = fmt.Sprintf("cluster %016x differs from node %d's cluster %016x", them.Cluster, self.Node, self.Cluster)
	case them.ConfigHash != self.ConfigHash && (cfgOK == nil || !cfgOK(them.Node, them.ConfigHash)):
		reason = fmt.Sprintf("configuration %016x differs from node %d's %016x (different member list, epoch, or lease timing: lease, max drift, mark-out)", them.ConfigHash, self.Node, self.ConfigHash)
	}
	if reason != "" {
		_, _ = fmt.Fprintf(nc, "ERR %s\n", reason)
		return 0, 0, nil, fmt.Errorf("%w: %s", ErrIdentity, reason)
	}
	if admit != nil && !admit(them.Node, theirInc) {
		_, _ = fmt.Fprintf(nc, "%s: node %d keeps the connection it holds with node %d\n", duplicatePrefix, self.Node, them.Node)
		return 0, 0, nil, fmt.Errorf("%w: node %d dialed while we hold a connection with it that beats the new one", errDuplicate, them.Node)
	}
	if _, err := fmt.Fprintf(nc, "READY %d %016x %016x %d %016x\n", self.Node, self.Cluster, self.ConfigHash, Protocol, inc); err != nil {
		return 0, 0, nil, fmt.Errorf("send ready: %w", err)
	}
	return them.Node, theirInc, lr.rest(), nil
}
