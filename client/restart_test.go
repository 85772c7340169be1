package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
)

// With WithRetryUnavailable a call that can reach no node — its only node
// restarting — dials again within the window and lands once the node is
// back; without it, it fails at once with ErrUnavailable. (A write whose
// connection died mid-flight is the same path with ErrUnknownOutcome at
// stake: test/e2e TestTxnsAcrossPowerCuts counted those as unknowns.)
func TestRetryUnavailableWaitsOutARestart(t *testing.T) {
	cfg := server.Config{
		ClientAddr: "127.0.0.1:0",
		DataDir:    t.TempDir(),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	start := func() *server.Server {
		t.Helper()
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		return srv
	}
	stop := func(srv *server.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	srv := start()
	cfg.ClientAddr = srv.ClientAddr().String() // the restart listens where the client dials
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	patient, err := Dial(ctx, []string{cfg.ClientAddr}, WithRetryUnavailable(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer patient.Close()
	hasty, err := Dial(ctx, []string{cfg.ClientAddr})
	if err != nil {
		t.Fatal(err)
	}
	defer hasty.Close()
	if err := patient.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	stop(srv)
	if err := hasty.Put(ctx, "k", []byte("0")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("without WithRetryUnavailable, a Put with the node down = %v, want ErrUnavailable at once", err)
	}
	restarted := make(chan *server.Server, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		srv, err := server.New(cfg)
		if err == nil {
			err = srv.Start()
		}
		if err != nil {
			t.Errorf("restart: %v", err)
			restarted <- nil
			return
		}
		restarted <- srv
	}()
	began := time.Now()
	err = patient.Put(ctx, "k", []byte("2"))
	took := time.Since(began)
	if srv := <-restarted; srv != nil {
		defer stop(srv)
	}
	if err != nil {
		t.Fatalf("with WithRetryUnavailable, a Put while the node restarts = %v after %s, want it to land once the node is back", err, took)
	}
	if v, err := patient.Get(ctx, "k"); err != nil || string(v) != "2" {
		t.Fatalf("k = %q, %v after the restart", v, err)
	}
	t.Logf("the Put landed %s after the node went down", took.Round(time.Millisecond))
}
