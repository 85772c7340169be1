package client

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kefir-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

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
