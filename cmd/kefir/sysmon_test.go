package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain runs the kefir command itself when a test starts this binary
// with KEFIR_TEST_MAIN=1 (TestServerKeepsSysmonAwake).
func TestMain(m *testing.M) {
	if os.Getenv("KEFIR_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestSysmonEnv(t *testing.T) {
	for _, tc := range []struct {
		env, want []string
		changed   bool
	}{
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=" + sysmonAwake}, true},
		{[]string{"GODEBUG="}, []string{"GODEBUG=" + sysmonAwake}, true},
		{[]string{"GODEBUG=gctrace=1", "B=2"}, []string{"GODEBUG=gctrace=1," + sysmonAwake, "B=2"}, true},
		{[]string{"GODEBUG=gctrace=1,schedtrace=0"}, []string{"GODEBUG=gctrace=1,schedtrace=0"}, false},
		{[]string{"GODEBUG=schedtrace=1000"}, []string{"GODEBUG=schedtrace=1000"}, false},
	} {
		got, changed := sysmonEnv(tc.env)
		if changed != tc.changed || !slices.Equal(got, tc.want) {
			t.Errorf("sysmonEnv(%q) = %q, %v; want %q, %v", tc.env, got, changed, tc.want, tc.changed)
		}
	}
}

// TestServerKeepsSysmonAwake starts `kefir server` and checks that the process
// runs with sysmonAwake in its environment (what the runtime read at start).
func TestServerKeepsSysmonAwake(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command(os.Args[0], "server", "--dir", t.TempDir(), "--client-addr", "127.0.0.1:0",
		"--peer-addr", "", "--http-addr", "", "--log-level", "warn")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }),
		"KEFIR_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var env string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		env = string(b)
		if strings.Contains(env, "GODEBUG="+sysmonAwake) {
			return
		}
	}
	t.Fatalf("the server's environment has no GODEBUG=%s: %q", sysmonAwake, env)
}
