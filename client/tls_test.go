package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) { return testgroup.LoopbackCert(t) }

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	s := newTestServerOn(t, &tls.Config{Certificates: []tls.Certificate{cert}})
	s.mu.Lock()
	s.password = "pw"
	s.mu.Unlock()
	ctx := testCtx(t)

	c := dialTest(t, s, WithTLS(&tls.Config{RootCAs: pool}), WithUser("default"), WithPassword("pw"))
	if err := c.Put(ctx, "k", []byte("over tls")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || string(v) != "over tls" {
		t.Fatalf("Get over TLS = %q, %v", v, err)
	}

	// A client that does not trust the certificate must not talk to the server.
	_, err := Dial(ctx, s.addr(), WithTLS(&tls.Config{}), WithDialTimeout(2*time.Second))
	var uerr x509.UnknownAuthorityError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &uerr) {
		t.Fatalf("untrusted certificate: err = %v, want ErrUnavailable caused by x509.UnknownAuthorityError", err)
	}
}
