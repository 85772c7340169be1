package main

import (
	"bytes"
	"testing"
)

// KEFIR_IO_LOOPS is read once, by kefir server's config loader, into
// Config.IOLoops (the server package reads no environment for it); a value
// that is not a positive number leaves the default (0: one loop per two
// processors), as the variable always did.
func TestIOLoopsFromEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
	}{{"", 0}, {"3", 3}, {" 2 ", 2}, {"0", 0}, {"-1", 0}, {"many", 0}} {
		cfg, err := loadServerConfig(nil, envMap(map[string]string{"KEFIR_IO_LOOPS": c.env}), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("KEFIR_IO_LOOPS=%q: %v", c.env, err)
		}
		if cfg.IOLoops != c.want {
			t.Errorf("KEFIR_IO_LOOPS=%q: IOLoops = %d, want %d", c.env, cfg.IOLoops, c.want)
		}
	}
}
