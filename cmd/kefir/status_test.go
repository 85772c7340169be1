package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/server"
)

// `kefir status --json` prints INFO's numbers as JSON numbers and its words as
// strings (issue 25 item 13): every value used to be a string.
func TestStatusJSONHasNumbers(t *testing.T) {
	s, err := server.New(server.Config{DataDir: t.TempDir(), ClientAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := runStatus(ctx, cliFlags{addr: s.ClientAddr().String(), json: true}, &out); err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(out.Bytes(), &fields); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	for k, want := range map[string]any{
		"uptime_in_seconds": 0.0, "connected_clients": 0.0, "log_pos": 0.0, "tcp_port": 0.0,
		"role": "", "default_consistency": "", "kefir_version": "",
	} {
		got, ok := fields[k]
		if !ok {
			t.Errorf("no field %s in %s", k, out.Bytes())
			continue
		}
		switch want.(type) {
		case float64:
			if _, ok := got.(float64); !ok {
				t.Errorf("%s = %#v, want a JSON number", k, got)
			}
		case string:
			if _, ok := got.(string); !ok {
				t.Errorf("%s = %#v, want a JSON string", k, got)
			}
		}
	}
}
