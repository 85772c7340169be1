package server

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// selfSigned writes a throwaway certificate and key for 127.0.0.1.
func selfSigned(t *testing.T) (certFile, keyFile string) { return testgroup.LoopbackCertFiles(t) }

func TestTLSClientPort(t *testing.T) {
	cert, key := selfSigned(t)
	s := startServer(t, func(c *Config) { c.TLSCert, c.TLSKey = cert, key })
	tc, err := tls.Dial("tcp", s.ClientAddr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	tc.Write(resp.AppendCommand(nil, []byte("PING")))
	v, err := resp.NewReader(tc, 0).ReadValue()
	if err != nil || string(v.Str) != "PONG" {
		t.Fatalf("PING over TLS = %v, %v", v, err)
	}
	// A plaintext client gets no service.
	nc, err := net.Dial("tcp", s.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	nc.Write([]byte("PING\r\n"))
	buf := make([]byte, 64)
	n, _ := nc.Read(buf)
	if string(buf[:n]) == "+PONG\r\n" {
		t.Fatal("plaintext PING answered on a TLS port")
	}
}
