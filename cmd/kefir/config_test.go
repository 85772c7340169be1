package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/vrshard"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigPrecedenceIsFlagsThenEnvThenFileThenDefaults(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kefir.toml")
	if err := os.WriteFile(file, []byte(`
client-addr = "127.0.0.1:1111"
durability = "cad"
max_clients = 7
idle-timeout = "5s"
node-id = "from-file"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := envMap(map[string]string{
		"KEFIR_CONFIG":      file,
		"KEFIR_DURABILITY":  "async",
		"KEFIR_MAX_CLIENTS": "8",
		"KEFIR_NODE_ID":     "from-env",
	})
	var stderr bytes.Buffer
	cfg, err := loadServerConfig([]string{"--node-id", "from-flag", "--retain-versions", "3", "--compact-interval", "-1s"}, env, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"node-id (flag over env and file)", cfg.NodeID, "from-flag"},
		{"durability (env over file)", cfg.Durability, level.Async},
		{"max-clients (env over file)", cfg.MaxClients, 8},
		{"client-addr (file over default)", cfg.ClientAddr, "127.0.0.1:1111"},
		{"idle-timeout (file)", cfg.IdleTimeout, 5 * time.Second},
		{"http-addr (default)", cfg.HTTPAddr, "127.0.0.1:8380"},
		{"consistency (default)", cfg.Consistency, level.ConsLinearizable},
		{"max-bulk (default: auto, the server's by mode)", cfg.MaxBulk, 0},
		{"max-request (default: auto)", cfg.MaxRequest, 0},
		{"retain-versions (flag)", cfg.RetainVersions, 3},
		{"compact-interval (flag, negative = never)", cfg.CompactInterval, -time.Second},
		{"checkpoint-interval (default)", cfg.CheckpointInterval, time.Minute},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestConfigErrorsNameTheirSource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(file, []byte(`no-such-option = 1`), 0o644)
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--config", file}, nil, `unknown option "no-such-option"`},
		{nil, map[string]string{"KEFIR_DURABILITY": "fast"}, "KEFIR_DURABILITY"},
		{[]string{"--consistency", "bounded(x)"}, nil, "--consistency"},
		{[]string{"--max-clients", "0"}, nil, "--max-clients"},
		{[]string{"--max-bulk", "lots"}, nil, "--max-bulk"},
		{[]string{"--max-request", "0"}, nil, "--max-request"},
		{nil, map[string]string{"KEFIR_MAX_REQUEST": "3GiB"}, "KEFIR_MAX_REQUEST"},
		{[]string{"--retain-versions", "-2"}, nil, "--retain-versions"},
		{[]string{"stray"}, nil, "unexpected arguments"},
		{[]string{"--zone", "rack 1"}, nil, `--zone`},
		{nil, map[string]string{"KEFIR_ZONE": "a,b"}, "KEFIR_ZONE"},
	}
	for _, c := range cases {
		_, err := loadServerConfig(c.args, envMap(c.env), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err = %v, want mention of %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHelpExplainsEveryOption(t *testing.T) {
	var stderr bytes.Buffer
	_, err := loadServerConfig([]string{"--help"}, envMap(nil), &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, o := range serverOptions {
		if !strings.Contains(stderr.String(), "--"+o.name) || !strings.Contains(stderr.String(), envName(o.name)) || o.help == "" {
			t.Errorf("--help does not explain %s", o.name)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "1024": 1024, "4k": 4096, "1GB": 1e9, "2 MiB": 2 << 20} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1XB", "MiB"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) accepted", bad)
		}
	}
}

func TestInterleavedFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	j := fs.Bool("json", false, "")
	a := fs.String("addr", "", "")
	pos, err := parseInterleaved(fs, []string{"k", "--json", "v", "--addr", "h:1", "--", "--literal"})
	if err != nil || !*j || *a != "h:1" || strings.Join(pos, ",") != "k,v,--literal" {
		t.Fatalf("pos=%q json=%v addr=%q err=%v", pos, *j, *a, err)
	}
}

func TestReplicationOptionsFromFileEnvAndFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kefir.toml")
	if err := os.WriteFile(file, []byte(`
members = "1@127.0.0.1:7381/127.0.0.1:6381,2@127.0.0.1:7382/127.0.0.1:6382,3@127.0.0.1:7383/127.0.0.1:6383"
cluster-id = 77
replica_id = 1
`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := envMap(map[string]string{"KEFIR_CONFIG": file, "KEFIR_REPLICA_ID": "2", "KEFIR_CLUSTER_SECRET": "s"})
	var stderr bytes.Buffer
	cfg, err := loadServerConfig([]string{"--bootstrap", "true"}, env, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Members) != 3 || cfg.Members[2].PeerAddr != "127.0.0.1:7383" || cfg.Members[2].ClientAddr != "127.0.0.1:6383" {
		t.Errorf("members = %+v", cfg.Members)
	}
	if cfg.ClusterID != 77 || cfg.ReplicaID != 2 || !cfg.Bootstrap {
		t.Errorf("cluster-id %d (want 77, file), replica-id %d (want 2, env), bootstrap %v (want true, flag)", cfg.ClusterID, cfg.ReplicaID, cfg.Bootstrap)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("valid replicated config refused: %v", err)
	}
	if _, err := loadServerConfig([]string{"--members", "1@nope"}, envMap(nil), &stderr); err == nil {
		t.Error("a malformed member list was accepted")
	}
	var help bytes.Buffer
	_, _ = loadServerConfig([]string{"--help"}, envMap(nil), &help)
	for _, opt := range []string{"--members", "--replica-id", "--cluster-id", "--bootstrap", "KEFIR_MEMBERS"} {
		if !strings.Contains(help.String(), opt) {
			t.Errorf("--help does not mention %s", opt)
		}
	}
}

func TestUpGroupBootstrapsOnlyOnFirstStart(t *testing.T) {
	dir := t.TempDir()
	g, err := prepareGroup(dir, upLayout{Nodes: 3, Groups: 1, Engine: "vr"}, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if !g.bootstrap || g.clusterID == 0 || g.secret == "" {
		t.Fatalf("first start: %+v", g)
	}
	if err := os.MkdirAll(filepath.Join(dir, "n2"), 0o755); err != nil {
		t.Fatal(err)
	}
	// One node has data: nobody bootstraps (a node without data recovers).
	g2, err := prepareGroup(dir, upLayout{Nodes: 3, Groups: 1, Engine: "vr"}, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if g2.bootstrap || g2.clusterID != g.clusterID || g2.secret != g.secret {
		t.Fatalf("restart: %+v, first %+v", g2, g)
	}
	// A single-node directory is not silently turned into a group.
	single := t.TempDir()
	if err := os.MkdirAll(filepath.Join(single, "n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := prepareGroup(single, upLayout{Nodes: 3, Groups: 1, Engine: "vr"}, 16000); err == nil {
		t.Fatal("a single-node data directory was reused for a group")
	}
}

// A restart of a cluster's directory keeps its layout: the same nodes,
// groups and engine, or (several groups) more nodes, which join it. Each
// other change is refused before a node starts, saying how to run it.
func TestUpLayoutIsKeptOrGrown(t *testing.T) {
	vr := func(nodes, groups int) upLayout { return upLayout{Nodes: nodes, Groups: groups, Engine: "vr"} }
	dir := t.TempDir()
	g, err := prepareGroup(dir, vr(5, 3), 16000)
	if err != nil || g.founders != 5 || !g.bootstrap {
		t.Fatalf("first start: %+v %v", g, err)
	}
	for i := 1; i <= 5; i++ {
		if err := os.MkdirAll(nodeDir(dir, i), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// More nodes: the founders keep their --members, the rest are new.
	g2, err := prepareGroup(dir, vr(7, 3), 16000)
	if err != nil || g2.founders != 5 || g2.bootstrap || g2.members != g.members || g2.clusterID != g.clusterID {
		t.Fatalf("grown: %+v %v (first %+v)", g2, err, g)
	}
	if err := os.MkdirAll(nodeDir(dir, 7), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		want upLayout
		says string
	}{
		{vr(6, 3), "node directories up to n7"},
		{vr(3, 3), "node directories up to n7"},
		{vr(7, 2), "started with --groups 3, not 2"},
		{vr(7, 1), "started with --groups 3, not 1"},
		{upLayout{Nodes: 7, Groups: 3, Engine: "mixed"}, "--engine vr, not mixed"},
	} {
		_, err := prepareGroup(dir, c.want, 16000)
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "run kefir up --dir "+dir+" --nodes 7 --groups 3") {
			t.Errorf("%+v: %v, want it to say %q and how to run the cluster", c.want, err, c.says)
		}
	}
	// Another --base-port: the map has the nodes at the first one's
	// addresses (and n6, n7 joined at them).
	if _, err := prepareGroup(dir, vr(7, 3), 17000); err == nil || !strings.Contains(err.Error(), "on --base-port 16000, not 17000") || !strings.Contains(err.Error(), "run kefir up --dir "+dir+" --base-port 16000 --nodes 7 --groups 3") {
		t.Errorf("a cluster of groups restarted on another --base-port: %v", err)
	}
	// One group does not grow by kefir up.
	one := t.TempDir()
	if _, err := prepareGroup(one, vr(3, 1), 16000); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if err := os.MkdirAll(nodeDir(one, i), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := prepareGroup(one, vr(5, 1), 16000); err == nil || !strings.Contains(err.Error(), "add-members") {
		t.Errorf("a group of 3 asked for 5 nodes: %v", err)
	}
	if _, err := prepareGroup(one, vr(3, 2), 16000); err == nil || !strings.Contains(err.Error(), "one replica group") {
		t.Errorf("a group asked to become 2: %v", err)
	}
	// One group's members come from the flags alone: another --base-port
	// is its nodes' new addresses.
	if _, err := prepareGroup(one, vr(3, 1), 17000); err != nil {
		t.Errorf("a group restarted on another --base-port: %v", err)
	}
	// A cluster.json from before the layout was kept: a cluster of
	// groups' founders are the nodes it has.
	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "cluster.json"), []byte(`{"cluster_id":7,"cluster_secret":"s"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		if err := os.MkdirAll(nodeDir(old, i), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g3, err := prepareGroup(old, vr(6, 2), 16000)
	if err != nil || g3.founders != 4 || g3.clusterID != 7 {
		t.Fatalf("older cluster.json grown: %+v %v", g3, err)
	}
	if b, _ := os.ReadFile(filepath.Join(old, "cluster.json")); !strings.Contains(string(b), `"nodes":4`) {
		t.Fatalf("the layout was not written: %s", b)
	}
}

// --io-model follows the same precedence as every option (flag over env over
// file over the platform default), and a value the server cannot run is
// refused with an error naming where it came from.
func TestIOModelOption(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kefir.toml")
	if err := os.WriteFile(file, []byte("io-model = \"goroutine\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	epollOK := server.DefaultIOModel() == server.IOEpoll
	type ioCase struct {
		name string
		args []string
		env  map[string]string
		want server.IOModel
	}
	cases := []ioCase{
		{"default: epoll where the platform has it", nil, nil, server.DefaultIOModel()},
		{"file", nil, map[string]string{"KEFIR_CONFIG": file}, server.IOGoroutine},
		{"env over default", nil, map[string]string{"KEFIR_IO_MODEL": "goroutine"}, server.IOGoroutine},
		{"flag over env and file", []string{"--io-model", "goroutine"}, map[string]string{"KEFIR_CONFIG": file, "KEFIR_IO_MODEL": "goroutine"}, server.IOGoroutine},
	}
	if epollOK {
		cases = append(cases,
			ioCase{"env over file", nil, map[string]string{"KEFIR_CONFIG": file, "KEFIR_IO_MODEL": "epoll"}, server.IOEpoll},
			ioCase{"flag over env", []string{"--io-model=epoll"}, map[string]string{"KEFIR_IO_MODEL": "goroutine"}, server.IOEpoll})
	}
	for _, c := range cases {
		cfg, err := loadServerConfig(c.args, envMap(c.env), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if cfg.IOModel != c.want {
			t.Errorf("%s: io-model = %q, want %q", c.name, cfg.IOModel, c.want)
		}
	}

	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("io_model = \"threads\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--io-model", "uring"}, nil, `--io-model: server: unknown I/O model "uring" (want epoll or goroutine)`},
		{nil, map[string]string{"KEFIR_IO_MODEL": "Epoll"}, "KEFIR_IO_MODEL: server: unknown I/O model"},
		{nil, map[string]string{"KEFIR_CONFIG": bad}, "io_model: server: unknown I/O model \"threads\""},
	} {
		_, err := loadServerConfig(c.args, envMap(c.env), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err = %v, want mention of %q", c.args, c.env, err, c.want)
		}
	}
	if !epollOK {
		if _, err := loadServerConfig([]string{"--io-model", "epoll"}, envMap(nil), &bytes.Buffer{}); err == nil {
			t.Error("--io-model epoll accepted on a platform without epoll")
		}
	}

	var help bytes.Buffer
	_, _ = loadServerConfig([]string{"--help"}, envMap(nil), &help)
	for _, want := range []string{"--io-model", "KEFIR_IO_MODEL", "epoll", "goroutine"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}

// server.Config.Validate is the last gate for callers that fill Config
// directly: an unknown model is an error, not a silent fallback.
func TestConfigValidateRefusesUnknownIOModel(t *testing.T) {
	base := server.Config{DataDir: t.TempDir(), ClientAddr: "127.0.0.1:0"}
	for _, m := range []server.IOModel{"", server.IOGoroutine} {
		c := base
		c.IOModel = m
		if err := c.Validate(); err != nil {
			t.Errorf("IOModel %q refused: %v", m, err)
		}
	}
	c := base
	c.IOModel = "threads"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `--io-model "threads"`) {
		t.Errorf("IOModel threads: err = %v", err)
	}
	c.IOModel = server.IOEpoll
	err := c.Validate()
	if epoll := server.DefaultIOModel() == server.IOEpoll; epoll != (err == nil) {
		t.Errorf("IOModel epoll (platform has epoll: %v): err = %v", epoll, err)
	}
}

// kefir up refuses an unknown --io-model before it creates or starts
// anything, naming the flag.
func TestUpRefusesUnknownIOModel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	err := runUp([]string{"--io-model", "threads", "--dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `--io-model: server: unknown I/O model "threads"`) {
		t.Fatalf("err = %v", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Fatalf("kefir up created %s before refusing the flag (stat: %v)", dir, statErr)
	}
}

// kefir up refuses --follower-reads with several groups before it starts
// anything: each group's leader serves a cluster's cross-client-monotonic
// reads (the nodes would refuse the flag with --groups one by one).
func TestUpRefusesFollowerReadsWithGroups(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	err := runUp([]string{"--groups", "2", "--follower-reads", "--dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--groups > 1 and --follower-reads") {
		t.Fatalf("err = %v", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Fatalf("kefir up created %s before refusing the flags (stat: %v)", dir, statErr)
	}
}

// kefir up --zones: refused without --groups > 1 and with a bad zone,
// before anything is created.
func TestUpRefusesBadZones(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--zones", "a,b,c"}, "--zones needs --groups 2 or more"},
		{[]string{"--groups", "2", "--zones", "a,,c"}, `got ""`},
		{[]string{"--groups", "2", "--zones", "a,b c"}, `got "b c"`},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		err := runUp(append(c.args, "--dir", dir), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want mention of %q", c.args, err, c.want)
		}
		// An empty zone has no ValidZone error to quote: the message
		// says what is wrong rather than "<nil>".
		if err != nil && strings.Contains(err.Error(), "nil") {
			t.Errorf("%v: err = %v: quotes a nil error", c.args, err)
		}
		if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
			t.Errorf("%v: kefir up created %s before refusing the flags (stat: %v)", c.args, dir, statErr)
		}
	}
}

// server.New applies Config.IOModel to the process (it is process-wide), and
// an empty one leaves the model alone.
func TestServerNewAppliesIOModel(t *testing.T) {
	orig := server.CurrentIOModel()
	t.Cleanup(func() { server.SetIOModel(orig) })
	open := func(m server.IOModel) {
		t.Helper()
		s, err := server.New(server.Config{DataDir: t.TempDir(), ClientAddr: "127.0.0.1:0", IOModel: m, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	other := server.IOGoroutine
	if orig == server.IOGoroutine && server.DefaultIOModel() == server.IOEpoll {
		other = server.IOEpoll
	}
	open(other)
	if got := server.CurrentIOModel(); got != other {
		t.Fatalf("after New with IOModel %s the process serves with %s", other, got)
	}
	open("")
	if got := server.CurrentIOModel(); got != other {
		t.Fatalf("New with no IOModel changed the model to %s", got)
	}
}

// The nilext tuning options reach the server's config; 0 for the sync delay
// means "no holding" (vrshard's negative), and bad values are refused with
// the option's name.
func TestNilextTuningOptions(t *testing.T) {
	var stderr bytes.Buffer
	cfg, err := loadServerConfig(nil, envMap(nil), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NilextBatch != 64 || cfg.NilextInterval != time.Millisecond || cfg.NilextSyncDelay != 5*time.Millisecond {
		t.Errorf("defaults: batch %d, interval %v, sync delay %v; want 64, 1ms, 5ms", cfg.NilextBatch, cfg.NilextInterval, cfg.NilextSyncDelay)
	}
	cfg, err = loadServerConfig([]string{"--nilext-batch", "8", "--nilext-interval", "3ms", "--nilext-sync-delay", "0"},
		envMap(nil), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NilextBatch != 8 || cfg.NilextInterval != 3*time.Millisecond || cfg.NilextSyncDelay >= 0 {
		t.Errorf("flags: batch %d, interval %v, sync delay %v; want 8, 3ms and a negative delay (no holding)", cfg.NilextBatch, cfg.NilextInterval, cfg.NilextSyncDelay)
	}
	for _, args := range [][]string{{"--nilext-batch", "0"}, {"--nilext-interval", "0s"}, {"--nilext-sync-delay", "-1ms"}, {"--nilext-interval", "soon"}} {
		if _, err := loadServerConfig(args, envMap(nil), &stderr); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: err %v, want a refusal naming %s", args, err, args[0])
		}
	}
}

// durationCase is one way of setting a duration option and the value it must
// give (anyNegative: any negative duration, vrshard's "off"; other values
// must match exactly).
type durationCase struct {
	args []string
	env  map[string]string
	want time.Duration
}

const anyNegative = time.Duration(math.MinInt64)

// checkDurationOption loads the server configuration for each case and
// compares the option's value, then checks that each bad value is refused
// with the option's name.
func checkDurationOption(t *testing.T, flag string, get func(serverConfig) time.Duration, cases []durationCase, bad []string) {
	t.Helper()
	var stderr bytes.Buffer
	for _, tc := range cases {
		cfg, err := loadServerConfig(tc.args, envMap(tc.env), &stderr)
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		if got := get(cfg); got != tc.want && !(tc.want == anyNegative && got < 0) {
			t.Errorf("%v %v: %s = %v, want %v", tc.args, tc.env, flag, got, tc.want)
		}
	}
	for _, v := range bad {
		if _, err := loadServerConfig([]string{flag, v}, envMap(nil), &stderr); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s %s: err %v, want a refusal naming the option", flag, v, err)
		}
	}
}

// --cad-sync-delay (KEFIR_CAD_SYNC_DELAY): 2ms by default, 0 turns holding off
// (a negative delay for vrshard), and bad values are refused by name.
func TestCadSyncDelayOption(t *testing.T) {
	checkDurationOption(t, "--cad-sync-delay", func(c serverConfig) time.Duration { return c.CadSyncDelay }, []durationCase{
		{nil, nil, 2 * time.Millisecond},
		{[]string{"--cad-sync-delay", "10ms"}, nil, 10 * time.Millisecond},
		{nil, map[string]string{"KEFIR_CAD_SYNC_DELAY": "500us"}, 500 * time.Microsecond},
		{[]string{"--cad-sync-delay", "0"}, nil, anyNegative},
	}, []string{"-1ms", "soon", "101ms"})
}

// --loop-spin (KEFIR_LOOP_SPIN): auto leaves the choice to the server (0),
// off is negative, a duration is taken as is, and bad values are refused
// with the option's name.
func TestLoopSpinOption(t *testing.T) {
	checkDurationOption(t, "--loop-spin", func(c serverConfig) time.Duration { return c.LoopSpin }, []durationCase{
		{nil, nil, 0},
		{[]string{"--loop-spin", "off"}, nil, -1},
		{[]string{"--loop-spin", "0"}, nil, -1},
		{[]string{"--loop-spin", "120us"}, nil, 120 * time.Microsecond},
		{nil, map[string]string{"KEFIR_LOOP_SPIN": "30us"}, 30 * time.Microsecond},
	}, []string{"-5us", "soon", "1s"})
}

// --fsync-extra-delay (KEFIR_FSYNC_EXTRA_DELAY): off by default, a duration up
// to 100ms, and bad values are refused by name.
func TestFsyncExtraDelayOption(t *testing.T) {
	checkDurationOption(t, "--fsync-extra-delay", func(c serverConfig) time.Duration { return c.FsyncExtraDelay }, []durationCase{
		{nil, nil, 0},
		{[]string{"--fsync-extra-delay", "1ms"}, nil, time.Millisecond},
		{nil, map[string]string{"KEFIR_FSYNC_EXTRA_DELAY": "2500us"}, 2500 * time.Microsecond},
	}, []string{"-1ms", "soon", "101ms"})
}

// --groups (issue 28, docs/cluster.md): parsed from a flag or the file, a
// valid layout accepted, and a layout with a gap, a group of an even size, a
// node that is not in --members, or with --nilext or follower reads refused
// at start with what is wrong.
func TestGroupsOption(t *testing.T) {
	members := "1@127.0.0.1:7381/127.0.0.1:6381,2@127.0.0.1:7382/127.0.0.1:6382,3@127.0.0.1:7383/127.0.0.1:6383"
	env := envMap(map[string]string{"KEFIR_CLUSTER_SECRET": "s"})
	load := func(groups string, extra ...string) (serverConfig, error) {
		var stderr bytes.Buffer
		args := append([]string{"--members", members, "--replica-id", "1", "--cluster-id", "7", "--groups", groups}, extra...)
		cfg, err := loadServerConfig(args, env, &stderr)
		if err != nil {
			return cfg, err
		}
		return cfg, cfg.Validate()
	}
	cfg, err := load("1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383")
	if err != nil || len(cfg.Groups) != 3 || cfg.Groups[1].Members[0] != 2 || cfg.Groups[2].Slots[0].Start != 10923 {
		t.Fatalf("valid --groups: %+v, %v", cfg.Groups, err)
	}
	for _, tc := range []struct {
		groups string
		extra  []string
		want   string
	}{
		{"1=1,2,3:0-16000", nil, "slot 16001 belongs to no group"},
		{"1=1,2:0-16383", nil, "needs an odd number"},
		{"1=1,2,4:0-16383", nil, "member 4 is not in --members"},
		{"1=2,3,1:0-16383", []string{"--nilext", "true"}, "--nilext is not supported yet with --groups"},
		{"1=1,2,3:0-16383", []string{"--follower-reads", "true"}, "--follower-reads is not supported with --groups"},
		{"1=1,2,3:0-8191;4294967296=1,2,3:8192-16383", nil, "group id 4294967296 is above 4294967295"},
		{"1=1,2,3:0-16383", []string{"--cluster-redirects", "maybe"}, "maybe"},
		{"1=1,2,3:zero", nil, "slot range"},
		{"65535=1,2,3:0-16383", nil, "reserved for the metadata group"},
		{"1=1,2,3:0-8191;2=1,2:8192-16383", []string{"--chain-groups", "3"}, "--chain-groups: 3 is not a group of --groups"},
		{"1=1,2,3:0-8191;2=1,2:8192-16383", []string{"--chain-groups", "x"}, "is not a group id"},
		{"1=1,2,3:0-8191;2=1,2:8192-16383", []string{"--chain-groups", "1"}, "group 2 has 2 members: a VR group needs an odd number"},
	} {
		if _, err := load(tc.groups, tc.extra...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--groups %s %v: %v, want %q", tc.groups, tc.extra, err, tc.want)
		}
	}
	// A chain group of --groups takes any number of members.
	if cfg, err := load("1=1,2,3:0-8191;2=1,2:8192-16383", "--chain-groups", "2"); err != nil || len(cfg.ChainGroups) != 1 || cfg.ChainGroups[0] != 2 {
		t.Errorf("--chain-groups 2 with a chain of two: %+v %v", cfg.ChainGroups, err)
	}
	if cfg, err := loadServerConfig([]string{"--chain-groups", "2"}, env, &bytes.Buffer{}); err == nil {
		if err = cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--chain-groups needs --groups") {
			t.Errorf("--chain-groups without --groups: %v", err)
		}
	}
	// Session tokens keep a part per group, and every group's leader serves
	// cross-client-monotonic reads: both levels are served.
	if cfg, err := load("1=1,2,3:0-8191;2=2,3,1:8192-16383", "--consistency", "session"); err != nil || cfg.Consistency.Kind != level.Session {
		t.Errorf("--groups with --consistency session: %v", err)
	}
	if cfg, err := load("1=1,2,3:0-8191;2=2,3,1:8192-16383", "--consistency", "cross-client-monotonic"); err != nil || cfg.Consistency.Kind != level.CrossClientMonotonic {
		t.Errorf("--groups with --consistency cross-client-monotonic: %v", err)
	}
	var stderr bytes.Buffer
	cfg, err = loadServerConfig([]string{"--cluster-redirects", "true"}, envMap(nil), &stderr)
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), "--cluster-redirects needs --groups") {
		t.Errorf("--cluster-redirects without --groups: %v", err)
	}
}

// --chain-stores gives each node of kefir up its --chain-store, n1 first;
// a list of the wrong length, an unknown store or a VR group is refused
// before anything starts. --chain-store and --chain-flush reach the
// server's configuration.
func TestChainStoresFlags(t *testing.T) {
	st, err := parseChainStores("m, d,buffered", 3, "chain")
	if err != nil || len(st) != 3 || st[0] != vrshard.ChainMemory || st[1] != vrshard.ChainLog || st[2] != vrshard.ChainBuffered {
		t.Fatalf("parseChainStores = %v, %v", st, err)
	}
	if st, err := parseChainStores("", 3, "chain"); err != nil || st != nil {
		t.Fatalf("empty: %v, %v; want nil (every node a log)", st, err)
	}
	for _, c := range []struct{ v, engine, want string }{
		{"m,d", "chain", "2 stores for 3 nodes"},
		{"m,d,ssd", "chain", `n3: chain store "ssd"`},
		{"m,d,d", "vr", "needs --engine chain"},
	} {
		if _, err := parseChainStores(c.v, 3, c.engine); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseChainStores(%q, %s) = %v, want %q", c.v, c.engine, err, c.want)
		}
	}
	dir := filepath.Join(t.TempDir(), "data")
	err = runUp([]string{"--engine", "chain", "--chain-stores", "m,d", "--dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "2 stores for 3 nodes") {
		t.Fatalf("kefir up: %v", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Fatalf("kefir up created %s before refusing the flag (stat: %v)", dir, statErr)
	}
	cfg, err := loadServerConfig([]string{"--engine", "chain", "--chain-store", "memory", "--chain-flush", "20ms"}, envMap(nil), &bytes.Buffer{})
	if err != nil || cfg.ChainStore != vrshard.ChainMemory || cfg.ChainFlush != 20*time.Millisecond {
		t.Fatalf("loadServerConfig: %v, store %v, flush %v", err, cfg.ChainStore, cfg.ChainFlush)
	}
	if _, err := loadServerConfig([]string{"--chain-flush", "0s"}, envMap(nil), &bytes.Buffer{}); err == nil {
		t.Fatal("--chain-flush 0s accepted")
	}
	// --chain-log-member: the chain has a log member unless told (a memory
	// or buffered member then waits for one's disk before a sync answer).
	if cfg.ChainNoLogMember {
		t.Fatal("--chain-log-member defaults to false")
	}
	cfg, err = loadServerConfig([]string{"--engine", "chain", "--chain-store", "memory", "--chain-log-member=false"}, envMap(nil), &bytes.Buffer{})
	if err != nil || !cfg.ChainNoLogMember {
		t.Fatalf("--chain-log-member=false: %v, no log member %v", err, cfg.ChainNoLogMember)
	}
	// The env var and the config file take it as the flag does.
	cfg, err = loadServerConfig(nil, envMap(map[string]string{"KEFIR_CHAIN_LOG_MEMBER": "false"}), &bytes.Buffer{})
	if err != nil || !cfg.ChainNoLogMember {
		t.Fatalf("KEFIR_CHAIN_LOG_MEMBER=false: %v, no log member %v", err, cfg.ChainNoLogMember)
	}
	file := filepath.Join(t.TempDir(), "kefir.toml")
	if err := os.WriteFile(file, []byte("chain-log-member = false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = loadServerConfig([]string{"--config", file}, envMap(nil), &bytes.Buffer{})
	if err != nil || !cfg.ChainNoLogMember {
		t.Fatalf("chain-log-member = false in a config file: %v, no log member %v", err, cfg.ChainNoLogMember)
	}
	// kefir up's --chain-log-member from --chain-stores: one chain has a
	// log member if some node is a log; a cluster's chain groups, each on
	// some of the nodes, only if every node is one (m,m,m,d over two groups:
	// group 1 is n1-n3, memory only — told it had a log member, its sync
	// writes failed forever; TestChainStoresGroupsSyncWrites).
	m, d, b := vrshard.ChainMemory, vrshard.ChainLog, vrshard.ChainBuffered
	for _, c := range []struct {
		stores []vrshard.ChainStore
		groups int
		want   bool
	}{
		{[]vrshard.ChainStore{m, m, m}, 1, false},
		{[]vrshard.ChainStore{b, b, m}, 1, false},
		{[]vrshard.ChainStore{m, m, d}, 1, true},
		{[]vrshard.ChainStore{d, d, d}, 1, true},
		{[]vrshard.ChainStore{m, m, m, d}, 2, false},
		{[]vrshard.ChainStore{d, m, d, d}, 2, false},
		{[]vrshard.ChainStore{m, m, m}, 2, false},
		{[]vrshard.ChainStore{d, d, d, d}, 2, true},
	} {
		if got := upChainLogMember(c.stores, c.groups); got != c.want {
			t.Errorf("upChainLogMember(%v, %d groups) = %v, want %v", c.stores, c.groups, got, c.want)
		}
	}
	// --precopy-rate: a size a second (default 16 MiB), 0 unpaced (the
	// member's option: negative).
	for v, want := range map[string]int64{"": 16 << 20, "4MiB": 4 << 20, "0": -1} {
		args := []string{"--engine", "chain"}
		if v != "" {
			args = append(args, "--precopy-rate", v)
		}
		cfg, err := loadServerConfig(args, envMap(nil), &bytes.Buffer{})
		if err != nil || cfg.PrecopyRate != want {
			t.Fatalf("--precopy-rate %q: %v, rate %d, want %d", v, err, cfg.PrecopyRate, want)
		}
	}
	if _, err := loadServerConfig([]string{"--precopy-rate", "fast"}, envMap(nil), &bytes.Buffer{}); err == nil {
		t.Fatal("--precopy-rate fast accepted")
	}
	// --chain-mode: the chain's update mode (default SU).
	for v, want := range map[string]chain.Mode{"": chain.SU, "su": chain.SU, "AUSI": chain.AUSI, "au": chain.AU} {
		args := []string{"--engine", "chain"}
		if v != "" {
			args = append(args, "--chain-mode", v)
		}
		cfg, err := loadServerConfig(args, envMap(nil), &bytes.Buffer{})
		if err != nil || cfg.ChainMode != want {
			t.Fatalf("--chain-mode %q: %v, mode %v, want %v", v, err, cfg.ChainMode, want)
		}
	}
	if _, err := loadServerConfig([]string{"--chain-mode", "async"}, envMap(nil), &bytes.Buffer{}); err == nil {
		t.Fatal("--chain-mode async accepted")
	}
	if err := runUp([]string{"--chain-mode", "au", "--dir", dir}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "needs --engine chain") {
		t.Fatalf("kefir up --chain-mode au on VR: %v", err)
	}
}

// --zone (KEFIR_ZONE): the node's failure domain, none by default.
func TestZoneOption(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{{nil, nil, ""}, {[]string{"--zone", "eu-west-1a"}, nil, "eu-west-1a"}, {nil, map[string]string{"KEFIR_ZONE": "rack7"}, "rack7"}} {
		cfg, err := loadServerConfig(c.args, envMap(c.env), &bytes.Buffer{})
		if err != nil || cfg.Zone != c.want {
			t.Errorf("%v %v: zone %q (%v), want %q", c.args, c.env, cfg.Zone, err, c.want)
		}
	}
}
