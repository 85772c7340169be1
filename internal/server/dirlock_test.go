package server

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// dirContents maps every file under dir but the lock file to its bytes.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == LockFileName {
			return err
		}
		b, err := os.ReadFile(p)
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// wantUntouched fails unless dir holds exactly before.
func wantUntouched(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := dirContents(t, dir)
	for p, b := range before {
		if a, ok := after[p]; !ok || a != b {
			t.Errorf("%s changed under the running node (%d bytes before, %d after, present %v)", p, len(b), len(a), ok)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared under the running node", p)
		}
	}
}

// A second node on a live node's directory fails in New, naming the holder,
// before it reads or writes anything there (the old code recovered the
// directory as if the first node had crashed, writing a hole and moving the
// next version, and only then failed to bind the port).
func TestSecondNodeOnALiveDirectoryFails(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		first := startServer(t, nil)
		dial(t, first).expect("SET a 1 => OK")
		dir := first.cfg.DataDir
		before := dirContents(t, dir)
		_, err := New(Config{DataDir: dir, ClientAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
		wantLocked(t, err, dir)
		wantUntouched(t, dir, before)
		dial(t, first).expect(`GET a => "1"`)

		// Shutdown releases the lock: the next node opens the directory.
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		second := startServer(t, func(c *Config) { c.DataDir = dir })
		dial(t, second).expect(`GET a => "1"`)
	})
	t.Run("replica", func(t *testing.T) {
		g := startGroup(t)
		cfg := g.cfgs[1]
		cfg.Bootstrap = false
		_, err := New(cfg)
		wantLocked(t, err, cfg.DataDir)
		// The live replica writes its own log meanwhile, so its files are not
		// compared here (the e2e test checks its next start logs no crash).
		if b, err := os.ReadFile(filepath.Join(cfg.DataDir, LockFileName)); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
			t.Fatalf("lock file holds %q (%v), want this process's pid", b, err)
		}
	})
}

func wantLocked(t *testing.T, err error, dir string) {
	t.Helper()
	if !errors.Is(err, ErrDirLocked) {
		t.Fatalf("New on a live node's directory: err = %v, want ErrDirLocked", err)
	}
	var le *DirLockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() || le.Dir != dir {
		t.Fatalf("err = %#v, want the holder's pid %d and dir %s", err, os.Getpid(), dir)
	}
	if msg := err.Error(); !strings.Contains(msg, "pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(msg, dir) {
		t.Fatalf("message %q does not name the holder's pid and the directory", msg)
	}
}

// A New that fails after taking the lock (here: a directory of the other
// mode) releases it, and LockDataDir overwrites a dead holder's pid.
func TestDirLockReleasedOnFailedOpen(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, LockFileName), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "vr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{DataDir: dir, ClientAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, ErrStaleConfig) {
		t.Fatalf("New on a replica's directory as a single node: %v, want ErrStaleConfig", err)
	}
	l, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after a failed New: %v", err)
	}
	defer l.Unlock()
	if b, _ := os.ReadFile(filepath.Join(dir, LockFileName)); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, want this process's pid", b)
	}
	if _, err := LockDataDir(dir); !errors.Is(err, ErrDirLocked) {
		t.Fatalf("second LockDataDir in one process: %v, want ErrDirLocked", err)
	}
}
