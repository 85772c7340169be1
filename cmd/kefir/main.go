// Command kefir is Kefir's one binary: the node (`kefir server`), the local cluster
// launcher (`kefir up`), the command-line client (`kefir get|put|del|cas|scan|status`),
// the benchmark (`kefir bench`) and `kefir version`.
//
// It wires packages together and parses the command line; it holds no storage,
// replication or protocol logic of its own, and nothing imports it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/vrshard"
)

const usage = `kefir — a replicated key-value store where every request says how much
consistency and durability it needs.

Usage:
  kefir up       [--nodes N] [--dir ./kefir-data]   start a local cluster on loopback
  kefir server   [options]                          run one node (see kefir server --help)
  kefir chain-master --id ID --peer-addr A --members M   a standalone chain master (--chain-master)
  kefir get KEY                                      read a key
  kefir put KEY VALUE                                write a key
  kefir del KEY...                                   delete keys
  kefir cas KEY EXPECTED NEW                         compare and swap
  kefir scan [START [END]] [--limit N]               ordered range read
  kefir status                                       node status
  kefir cluster move-slots --from G --to G --slots A-B   move slots between groups, live
  kefir cluster rebalance [--by bytes|keys|load] [--dry-run]   even the groups out by slot moves, paced by a latency probe
  kefir cluster status                                 the metadata group's map, moves in flight, group leaders
  kefir cluster add-node --id N --client-addr A --peer-addr A   record a node in the metadata group's map
  kefir cluster add-group --members A,B,C [--id G] [--engine vr|chain]  a new group on nodes of the map (no slots until a rebalance)
  kefir cluster replace-node --old N --new ID@PEER/CLIENT       replace a node in its VR group(s) (the new node: kefir server --join)
  kefir cluster remove-node --id N[,M]                         remove nodes from their VR group(s)
  kefir cluster add-members --group G --new ID@PEER/CLIENT,...  grow a VR group by nodes, two at a time
  kefir chain restart --without N --http ADDR[,ADDR]   restart a chain that is down without members that never came back
  kefir bench    [--workload a..f|w] [--clients N]   YCSB load against a cluster (see kefir bench --help)
  kefir version                                      print the version

Client commands take --addr (default 127.0.0.1:6380, env KEFIR_ADDR), --password
(env KEFIR_PASSWORD), --consistency, --durability and --json.

Exit status: 0 on success; 1 on an error, and for kefir get of a missing key
(with --json after printing {"found":false,"key":KEY}); 2 for a bad invocation.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "server":
		err = runServer(rest, stderr)
	case "up":
		err = runUp(rest, stdout, stderr)
	case "chain-master":
		err = runChainMaster(rest, stderr)
	case "chain":
		err = runChain(rest, stdout, stderr)
	case "bench":
		err = runBench(rest, stdout, stderr)
	case "cluster":
		err = runCluster(rest, stdout, stderr)
	case "get", "put", "del", "cas", "scan", "status":
		err = runClient(cmd, rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "kefir %s (%s %s/%s)\n", server.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "kefir: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var status exitStatus
	if errors.As(err, &status) {
		return int(status)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kefir %s: %v\n", cmd, err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError marks errors in how the command was invoked (exit status 2).
type usageError struct{ error }

// exitStatus ends a command that has already reported its outcome (a missing
// key) with that status and no further message.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

func runServer(args []string, stderr io.Writer) error {
	cfg, err := loadServerConfig(args, os.Getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	log, err := newLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if err != nil {
		return usageError{err}
	}
	cfg.Logger = log
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// A new member (--join) waits until the group names it; a signal
	// ends the wait. A node that joined before finds its group in --dir.
	jctx, jcancel := context.WithCancel(context.Background())
	signalled := make(chan bool, 1)
	go func() {
		select {
		case sig := <-sigs:
			log.Info("signal received before the node started: stopping", "signal", sig.String())
			jcancel()
			signalled <- true
		case <-jctx.Done():
			signalled <- false
		}
	}()
	joined, err := server.PrepareJoin(jctx, cfg.Config, func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...), "component", "join") })
	jcancel()
	if <-signalled {
		return nil
	}
	if err != nil {
		log.Error("refusing to start", "err", err)
		return err
	}
	cfg.Config = joined
	// The wiring: a node with members hosts a VR replica of its group. The
	// front door knows only the cluster contract; the engine is chosen here.
	cfg.OpenReplica = vrshard.OpenHosted
	// A chain group of a cluster of several groups (kefir cluster
	// add-group --engine chain): any node of the cluster may be named in
	// one, so every node can open one.
	cfg.OpenChainReplica = vrshard.OpenChainGroup(vrshard.ChainStoreOptions{Store: cfg.ChainStore, Flush: cfg.ChainFlush, NoLogMember: cfg.ChainNoLogMember, PrecopyRate: cfg.PrecopyRate})
	if cfg.Engine != "chain" && len(cfg.Groups) == 0 && cfg.ChainStore != vrshard.ChainLog {
		// (A node of several groups takes it for the chain groups it is
		// named in.)
		return usageError{fmt.Errorf("--chain-store %v needs --engine chain (or --groups: for its chain groups)", cfg.ChainStore)}
	}
	if cfg.Engine != "chain" && cfg.ChainMode != chain.SU {
		return usageError{fmt.Errorf("--chain-mode %v needs --engine chain", cfg.ChainMode)}
	}
	if cfg.Engine == "chain" {
		if len(cfg.Members) == 0 {
			return usageError{errors.New("--engine chain needs --members (the chain, head first)")}
		}
		// The master hosted by the metadata group (the first members by
		// id), or a standalone one (--chain-master).
		cfg.Chain = true // any number of members (a chain of two runs)
		st := vrshard.ChainStoreOptions{Store: cfg.ChainStore, Flush: cfg.ChainFlush, NoLogMember: cfg.ChainNoLogMember, PrecopyRate: cfg.PrecopyRate, Mode: cfg.ChainMode}
		cfg.OpenReplica = vrshard.OpenHostedChainNode(0, st)
		if cfg.ChainMaster.ID != 0 {
			cfg.OpenReplica = vrshard.OpenHostedChain(cfg.ChainMaster.ID, cfg.ChainMaster.PeerAddr, st)
		}
	}
	srv, err := server.New(cfg.Config)
	if err != nil {
		log.Error("refusing to start", "err", err)
		return err
	}
	if err := srv.Start(); err != nil {
		_ = srv.Close()
		return err
	}
	select {
	case sig := <-sigs:
		log.Info("signal received: shutting down gracefully (send again to exit at once)", "signal", sig.String())
	case <-srv.Retired():
		// The group no longer has this node (kefir cluster replace-node or
		// remove-node): recorded in --dir, which the node refuses to run
		// again; it exits cleanly with the reason.
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "kefir server: %v\n", srv.RetiredErr())
		return nil
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		done <- srv.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		return err
	case sig := <-sigs:
		log.Warn("second signal: exiting without finishing shutdown", "signal", sig.String())
		os.Exit(1)
	}
	return nil
}
