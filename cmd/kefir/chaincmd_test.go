package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestChainRestartCommand: kefir chain restart asks each admin address in
// turn: a node whose master does not act (503) sends it to the next; the
// acting master's answer is printed; its refusal (409) is the command's
// error. A bad invocation is a usage error (exit 2).
func TestChainRestartCommand(t *testing.T) {
	var got []string
	passive := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, "passive "+r.Method+" "+r.URL.String())
		http.Error(w, "does not act", http.StatusServiceUnavailable)
	}))
	defer passive.Close()
	acting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, "acting "+r.Method+" "+r.URL.String())
		w.Write([]byte("the chain restarted from node 2\n"))
	}))
	defer acting.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the chain is not down", http.StatusConflict)
	}))
	defer refusing.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	var out, errOut bytes.Buffer
	if code := run([]string{"chain", "restart", "--without", "3", "--http", host(passive) + "," + host(acting)}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "the chain restarted from node 2") {
		t.Fatalf("output %q", out.String())
	}
	want := []string{"passive POST /chain/restart?without=3", "acting POST /chain/restart?without=3"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("requests %v, want %v", got, want)
	}
	// A cluster's chain group: named to the admin port.
	got = nil
	out.Reset()
	if code := run([]string{"chain", "restart", "--without", "3,4", "--group", "2", "--http", host(acting)}, &out, &errOut); code != 0 {
		t.Fatalf("--group 2: exit %d: %s", code, errOut.String())
	}
	if want := "acting POST /chain/restart?group=2&without=3%2C4"; len(got) != 1 || got[0] != want {
		t.Fatalf("--group 2: requests %v, want %s", got, want)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"chain", "restart", "--without", "3", "--http", host(refusing) + "," + host(acting)}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "the chain is not down") {
		t.Fatalf("a refusal: exit %d, %q", code, errOut.String())
	}
	for _, args := range [][]string{{"chain"}, {"chain", "restart"}, {"chain", "restart", "--without", "3"}} {
		if code := run(args, &out, &errOut); code != 2 {
			t.Fatalf("kefir %v: exit %d, want 2", args, code)
		}
	}
}
