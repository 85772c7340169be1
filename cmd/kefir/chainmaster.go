package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/transport"
)

// runChainMaster is `kefir chain-master`: the standalone master of a chain
// group (internal/chainmaster) as a process of its own, a node id outside
// the chain on the members' peer transport, for servers started with
// --chain-master. It is not replicated: while it is down the members'
// leases lapse and the chain serves nothing (docs/chain.md). Without
// --chain-master the chain's master is hosted by its metadata group.
func runChainMaster(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir chain-master", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self := fs.Uint64("id", 0, "This master's node id (outside --members; the members name it in --chain-master).")
	peerAddr := fs.String("peer-addr", "", "Peer listen address (the members connect to it).")
	members := fs.String("members", "", "The chain's members, head first, as the servers' --members (ID@PEER-ADDR/CLIENT-ADDR,...).")
	clusterID := fs.Uint64("cluster-id", 0, "The group's --cluster-id.")
	secret := fs.String("cluster-secret", os.Getenv("KEFIR_CLUSTER_SECRET"), "The group's --cluster-secret (env KEFIR_CLUSTER_SECRET).")
	failAfter := fs.Duration("fail-after", chainmaster.DefaultFailAfter, "A member silent this long is declared failed and the chain repaired around it (must exceed the members' lease, "+chainmaster.DefaultLease.String()+").")
	resendAfter := fs.Duration("resend-after", chainmaster.DefaultResendAfter, "An order to a member (a repair, a join's pre-copy, flush or truncation) unanswered this long is sent again (rounded up to heartbeat intervals of "+chainmaster.DefaultHeartbeat.String()+").")
	chainMode := fs.String("chain-mode", "su", "The chain's update mode, as every member's --chain-mode (su, ausi or au): a member that runs another is refused.")
	logLevel := fs.String("log-level", "info", "Log level: debug, info, warn, error.")
	learnWithout := fs.String("learn-without", "", "Members (ids, comma-separated) not to wait for: a master starts with no record of the chain and acts only once it has heard "+
		"every member (one silent may hold a newer configuration, and writes only it acknowledged, which are then lost): name the members dead for good, "+
		"of --members or joined since (docs/chain.md).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	ms, err := server.ParseMembers(*members)
	if err != nil {
		return usageError{err}
	}
	if *self == 0 || *peerAddr == "" || len(ms) == 0 || *secret == "" {
		return usageError{errors.New("--id, --peer-addr, --members and --cluster-secret are required")}
	}
	without, err := parseLearnWithout(*learnWithout, *self)
	if err != nil {
		return usageError{err}
	}
	mode, err := chain.ParseMode(*chainMode)
	if err != nil {
		return usageError{err}
	}
	if *failAfter <= chainmaster.DefaultLease {
		return usageError{fmt.Errorf("--fail-after %v must exceed the members' lease %v", *failAfter, chainmaster.DefaultLease)}
	}
	log, err := newLogger(*logLevel, "text", stderr)
	if err != nil {
		return usageError{err}
	}
	log = log.With("node", "chain-master-"+strconv.FormatUint(*self, 10))
	peers := map[uint64]string{*self: *peerAddr}
	ids := make([]uint64, len(ms))
	for i, m := range ms {
		ids[i], peers[m.ID] = m.ID, m.PeerAddr
	}
	tr, err := transport.New(transport.Config{Self: *self, Peers: peers, ClusterSecret: *secret, Cluster: *clusterID, Logger: log})
	if err != nil {
		return fmt.Errorf("peer transport: %w", err)
	}
	defer tr.Close()
	if _, err := tr.Listen(*peerAddr); err != nil {
		return fmt.Errorf("peer listener on %s: %w", *peerAddr, err)
	}
	m, err := chainmaster.Start(chainmaster.Config{Self: *self, Members: ids, Transport: tr, FailAfter: *failAfter, ResendAfter: *resendAfter, Logger: log, Mode: mode,
		LearnWithout: without})
	if err != nil {
		return err
	}
	defer m.Close()
	log.Info("chain master up", "members", ids, "peer_addr", *peerAddr)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := fmt.Sprint(ids)
	for {
		select {
		case sig := <-sigs:
			log.Info("signal received: stopping", "signal", sig.String())
			return nil
		case <-t.C:
			if now := fmt.Sprint(m.Members()); now != last {
				log.Info("chain reconfigured", "members", strings.Trim(now, "[]"))
				last = now
			}
		}
	}
}

// parseLearnWithout parses --learn-without: member ids, comma-separated
// (empty: none). An id outside --members is taken: the master waits for
// every member of every configuration it learns, and a member that joined
// since --members was written — dead for good — can be forgone only so
// (chainmaster.Config.LearnWithout). A mistyped id forgoes nobody real: the
// master then logs whom it still waits for.
func parseLearnWithout(s string, self uint64) ([]uint64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ids []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		id, err := strconv.ParseUint(f, 10, 64)
		switch {
		case f == "":
			return nil, fmt.Errorf("--learn-without %q: an empty id", s)
		case err != nil || id == 0:
			return nil, fmt.Errorf("--learn-without %q: %q is not a node id (a positive integer)", s, f)
		case id == self:
			return nil, fmt.Errorf("--learn-without %q: %d is this master's --id, not a member", s, id)
		case slices.Contains(ids, id):
			return nil, fmt.Errorf("--learn-without %q: %d named twice", s, id)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
