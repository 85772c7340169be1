package server

import (
	"testing"
)

// Config.IOLoops sets the process's event-loop count (New hands it to
// setIOLoops); 0 keeps what is set, and with nothing set the count is one
// loop per two processors. The environment plays no part here: kefir
// server reads KEFIR_IO_LOOPS into the Config.
func TestIOLoopsFromConfig(t *testing.T) {
	old := ioLoops.Load()
	t.Cleanup(func() { ioLoops.Store(old) })
	t.Setenv("KEFIR_IO_LOOPS", "7") // ignored by the package

	ioLoops.Store(0)
	if got := loopCount(); got != defaultIOLoops {
		t.Errorf("unset: %d loops, want the default %d", got, defaultIOLoops)
	}
	cfg := Config{DataDir: t.TempDir(), IOLoops: 3}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := loopCount(); got != 3 {
		t.Errorf("Config.IOLoops 3: %d loops", got)
	}
	setIOLoops(0)
	if got := loopCount(); got != 3 {
		t.Errorf("IOLoops 0 after 3: %d loops, want 3 kept", got)
	}
}
