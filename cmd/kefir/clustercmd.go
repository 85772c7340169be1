package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// runCluster runs `kefir cluster move-slots --from G --to G --slots a-b[,c-d]`
// (docs/cluster.md, "Moving slots"): a live move of slot ranges between two
// groups, driven through the groups' leaders (cluster.Mover). Run again, it
// finishes a move that stopped part way; with --abort it rolls back one that
// stopped before its hand-over.
func runCluster(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "status" {
		return runClusterStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "add-node" {
		return runClusterAddNode(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "add-group" {
		return runClusterAddGroup(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "remove-group" {
		return runClusterRemoveGroup(args[1:], stdout, stderr)
	}
	if len(args) > 0 && (args[0] == "replace-node" || args[0] == "remove-node" || args[0] == "add-members") {
		return runClusterMembers(args[0], args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "rebalance" {
		return runClusterRebalance(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "move-slots" {
		return usageError{errors.New(clusterUsage)}
	}
	fs := flag.NewFlagSet("kefir cluster move-slots", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	from := fs.Uint64("from", 0, "the group the slots move from")
	to := fs.Uint64("to", 0, "the group the slots move to")
	slots := fs.String("slots", "", "the slots: START-END[,START-END...]")
	page := fs.Int("page", 1024, "keys per copy round trip")
	pause := fs.Duration("page-pause", 0, "a fixed pause after each page of the pre-copy and of the purge (its listing too), never inside the hand-over's window, instead of the adaptive one (0: unpaced)")
	maxPause := fs.Duration("max-pause", 250*time.Millisecond, "the adaptive pause's upper bound (the move goes on at this pace however slow the probe is)")
	baseline := fs.Duration("baseline", time.Second, "how long the adaptive pace's probe measures the steady p99 before the move")
	timeout := fs.Duration("timeout", 10*time.Minute, "deadline for the whole move")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	abort := fs.Bool("abort", false, "roll back the move instead of finishing it: a recorded move is taken over at once and marked for abort; past its hand-over it is finished instead, and the command says so and fails")
	record := fs.Bool("record", true, "record the move in the metadata group (planned, then done) and drive it under a lease there, so that the metadata leader finishes it if this process dies; false: only the groups' tables know it")
	lease := fs.Duration("lease", cluster.DefaultLease, "with --record, the driver's lease: renewed every quarter of it; the metadata leader takes the move over after two without a renewal")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *from == 0 || *to == 0 || *slots == "" || fs.NArg() != 0 {
		return usageError{errors.New("move-slots needs --from, --to and --slots")}
	}
	rs, err := cluster.ParseSlotRanges(*slots)
	if err != nil {
		return usageError{err}
	}
	if err := checkRebalanceFlags(0, cluster.ByBytes, 0, 0, time.Second, *page, *maxPause); err != nil {
		return usageError{err}
	}
	if *baseline <= 0 {
		return usageError{fmt.Errorf("--baseline %v: > 0", *baseline)}
	}
	host, _ := os.Hostname()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "kefir cluster: "+format+"\n", a...) }
	newMover := func() *cluster.Mover {
		mv := mover()
		mv.Page, mv.PagePause, mv.Meta, mv.Lease = *page, *pause, *record, *lease
		mv.Driver = fmt.Sprintf("kefir cluster move-slots, pid %d on %s", os.Getpid(), host)
		mv.Logf = logf
		return mv
	}
	mv := newMover()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *abort {
		if err := mv.Abort(ctx, cluster.GroupID(*from), cluster.GroupID(*to), rs); err != nil {
			return err
		}
		_, err := fmt.Fprintf(stdout, "rolled back the move of %s from group %d to group %d\n", *slots, *from, *to)
		return err
	}
	// Paced like a rebalance's moves: by the latency probe (the foreground's
	// p99 kept within twice its steady value), unless --page-pause fixes
	// the pause.
	fixed := false
	fs.Visit(func(fl *flag.Flag) { fixed = fixed || fl.Name == "page-pause" })
	mv.Close()
	rb := &cluster.Rebalancer{NewMover: newMover, Adaptive: !fixed && *record, MaxPause: *maxPause, Baseline: *baseline, Logf: logf}
	res, probe, err := rb.Move(ctx, cluster.GroupID(*from), cluster.GroupID(*to), rs)
	if err != nil {
		return err
	}
	if *asJSON {
		out := map[string]any{"epoch": res.Epoch, "copied": res.Copied, "final": res.Final,
			"deleted": res.Deleted, "purged": res.Purged, "resumed": res.Resumed,
			"precopy_ms": res.PreCopy.Milliseconds(), "handover_ms": res.Freeze.Milliseconds(), "total_ms": res.Total.Milliseconds()}
		if probe != nil {
			out["probe"] = probe
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	_, err = fmt.Fprintf(stdout, "moved %s from group %d to group %d at epoch %s\n", *slots, *from, *to, strconv.FormatUint(res.Epoch, 10))
	return err
}

// clusterUsage lists the kefir cluster commands.
const clusterUsage = `usage: kefir cluster COMMAND [flags] (each with --help)
  move-slots --from G --to G --slots START-END[,START-END...] [--page-pause D]
                                                                 move slot ranges live between two groups, paced
                                                                 by a latency probe unless --page-pause is given
  rebalance [--by bytes|keys|load] [--tolerance F] [--dry-run] [--max-moves N] [--page-pause D] [--json]
                                                                 move contiguous slot ranges until every group is
                                                                 within the tolerance of the mean, one move at a time,
                                                                 paced by a latency probe unless --page-pause is given
  status                                                         the metadata group's map, moves in flight, leaders
  add-node --id N --client-addr H:P --peer-addr H:P [--zone Z]   record a node (and its failure domain) in the map
  add-group [--members A,B,C | --replicas R] [--id G] [--engine vr|chain]
                                                                 a new group on nodes of the map, owning no slots
                                                                 until a rebalance or move-slots gives it some;
                                                                 without --members its R (3) replicas go to the
                                                                 live nodes hosting the fewest replicas, in
                                                                 distinct zones when there are enough
  remove-group --id G [--by bytes|keys|load] [--page-pause D]    move every slot of a data group to the others, then
                                                                 take it out of the map; its members retire its replicas
  replace-node --old N [--new ID@PEER-ADDR/CLIENT-ADDR]           replace a failed node by a new one in every group it is in;
                                                                 without --new (several groups) its replicas go to the map's
                                                                 live nodes, each group the least loaded node not in it
                                                                 (in a zone the group lacks first)
  remove-node --id N[,M...]                                       remove members of a single VR group (an odd number stays)
  add-members --group G --new ID[@PEER-ADDR/CLIENT-ADDR][,...]      grow a VR group (or the metadata group, 65535) by
                                                                 nodes, two at a time: they join and pull its state
  add-members --group G --replicas N                              the same, to N members placed on the live nodes not
                                                                 in it that host the fewest replicas
every command takes --addr host:port,... (env KEFIR_ADDR), --password, --tls, --tls-insecure`

// runClusterRebalance runs `kefir cluster rebalance`: it weighs each slot
// (bytes, keys, or keys written during a sample: KEFIR.SLOTS STATS at each
// group's leader), plans contiguous slot-range moves that bring every group
// within the tolerance of the mean (cluster.PlanRebalance), prints the plan
// and, unless --dry-run, runs the moves one at a time through the move-slots
// driver (cluster.Mover), each paced by a latency probe that keeps the
// foreground's p99 within twice its steady value (cluster.Prober), or by a
// fixed --page-pause.
func runClusterRebalance(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster rebalance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	rf := addRebalanceFlags(fs, "weigh slots by bytes, keys or load (keys written and reads served during --sample)", "rebalance")
	by := rf.by
	tolerance := fs.Float64("tolerance", 0.1, "the fraction of the mean every group must end within")
	dry := fs.Bool("dry-run", false, "print the plan and stop")
	maxMoves := fs.Int("max-moves", 0, "at most this many moves (0: the planner's bound, 64; at most 64)")
	asJSON := fs.Bool("json", false, "print the plan (and the moves' results) as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if err := checkRebalanceFlags(fs.NArg(), *by, *tolerance, *maxMoves, *rf.sample, *rf.page, *rf.maxPause); err != nil {
		return usageError{err}
	}
	// Ctrl-C or SIGTERM cancels the run: the probe deletes its keys and
	// the move in hand stops where it is, recorded in the map; the
	// metadata group's leader finishes it once its lease lapses (unpaced),
	// or move-slots does. A rerun refuses to plan until it is done.
	ctx, cancel := rf.context()
	defer cancel()
	mv := mover()
	defer mv.Close()
	mv.Page, mv.PagePause = *rf.page, *rf.pause
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return err
	}
	if len(cm.Moves) > 0 {
		m := cm.Moves[0]
		return fmt.Errorf("rebalance: a move is in flight (slots %s from group %d to group %d): finish or abort it with move-slots first", cluster.FormatSlotRanges(m.Slots), m.From, m.To)
	}
	groups, weights, err := rf.weighSlots(ctx, mv, cm)
	mv.Close()
	if err != nil {
		return err
	}
	plan := cluster.PlanRebalance(groups, weights, *tolerance, *maxMoves)
	if !*asJSON {
		fmt.Fprintf(stdout, "by %s at map epoch %d\n%s", *by, cm.Epoch, plan)
	}
	if *dry || len(plan.Moves) == 0 {
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(map[string]any{"by": *by, "epoch": cm.Epoch, "plan": plan}); err != nil {
				return err
			}
		}
		return stuckStatus(plan, *dry)
	}
	rb := rf.rebalancer("rebalance", mover, stderr)
	t0 := time.Now()
	done, err := rb.Run(ctx, plan)
	if *asJSON {
		if jerr := json.NewEncoder(stdout).Encode(map[string]any{"by": *by, "epoch": cm.Epoch, "plan": plan, "moves": done,
			"total_ms": time.Since(t0).Milliseconds()}); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		for _, m := range done {
			fmt.Fprintf(stdout, "moved %d-%d from group %d to group %d at epoch %d in %v\n", m.Slots.Start, m.Slots.End, m.From, m.To, m.Result.Epoch, m.Result.Total.Round(time.Millisecond))
		}
	}
	return err
}

// rebalanceFlags are the flags kefir cluster rebalance and remove-group
// share: how the slots are weighed, how each move is paced and leased, and
// the whole run's deadline.
type rebalanceFlags struct {
	fs                                                *flag.FlagSet
	by                                                *string
	sample, pause, maxPause, baseline, timeout, lease *time.Duration
	page                                              *int
}

// addRebalanceFlags defines them on fs (byHelp: --by's help; what: the
// run --timeout bounds).
func addRebalanceFlags(fs *flag.FlagSet, byHelp, what string) *rebalanceFlags {
	return &rebalanceFlags{fs: fs,
		by:       fs.String("by", cluster.ByBytes, byHelp),
		sample:   fs.Duration("sample", 2*time.Second, "with --by load, how long writes and reads are counted"),
		page:     fs.Int("page", 1024, "keys per copy round trip"),
		pause:    fs.Duration("page-pause", 0, "a fixed pause after each page outside the hand-over's window instead of the adaptive one (0: unpaced)"),
		maxPause: fs.Duration("max-pause", 250*time.Millisecond, "the adaptive pause's upper bound (the move goes on at this pace however slow the probe is)"),
		baseline: fs.Duration("baseline", time.Second, "how long the probe measures the steady p99 before each move"),
		timeout:  fs.Duration("timeout", 30*time.Minute, "deadline for the whole "+what),
		lease:    fs.Duration("lease", cluster.DefaultLease, "each move's driver lease in the metadata group"),
	}
}

// context is the run's: --timeout, and cancelled by Ctrl-C or SIGTERM.
func (f *rebalanceFlags) context() (context.Context, context.CancelFunc) {
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(sigCtx, *f.timeout)
	return ctx, func() { cancel(); stopSignals() }
}

// weighSlots reads each group's slot table and weighs every slot by --by
// through mv: what a plan is made from.
func (f *rebalanceFlags) weighSlots(ctx context.Context, mv *cluster.Mover, cm *kv.ClusterMap) ([]cluster.PlanGroup, []int64, error) {
	groups := cluster.PlanGroups(cm)
	if err := mv.PlanTables(ctx, groups); err != nil {
		return nil, nil, err
	}
	weights, err := mv.SlotWeights(ctx, cm, *f.by, *f.sample)
	return groups, weights, err
}

// rebalancer is the run's Rebalancer (cmd names the driver in the map):
// each move by a fresh recorded Mover, paced by the latency probe unless
// --page-pause was given (a fixed pause, then).
func (f *rebalanceFlags) rebalancer(cmd string, mover func() *cluster.Mover, stderr io.Writer) *cluster.Rebalancer {
	fixed := false
	f.fs.Visit(func(fl *flag.Flag) { fixed = fixed || fl.Name == "page-pause" })
	host, _ := os.Hostname()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "kefir cluster: "+format+"\n", a...) }
	return &cluster.Rebalancer{Adaptive: !fixed, MaxPause: *f.maxPause, Baseline: *f.baseline, Logf: logf, NewMover: func() *cluster.Mover {
		m := mover()
		m.Page, m.PagePause, m.Meta, m.Lease = *f.page, *f.pause, true, *f.lease
		m.Driver = fmt.Sprintf("kefir cluster %s, pid %d on %s", cmd, os.Getpid(), host)
		m.Logf = logf
		return m
	}}
}

// runClusterRemoveGroup runs `kefir cluster remove-group --id G`: every
// slot of data group G moves to the other groups (cluster.PlanDrain's
// plan, run one move at a time by the rebalance's Rebalancer: recorded,
// leased, paced), then G leaves the metadata group's map
// (kv.KindMapRemoveGroup, compare-and-set by the map's epoch), and its
// members retire their replicas when they see it (server: retireRemoved).
// Each step starts from the map, so a rerun after a crash (of this command
// or of a node) goes on from where things are: a move left in flight is
// finished first (resumed, or taken over once its lease lapsed), slots G
// still owns are planned again, and a group already removed is a no-op.
func runClusterRemoveGroup(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster remove-group", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	id := fs.Uint64("id", 0, "the data group to remove")
	rf := addRebalanceFlags(fs, "weigh the group's slots by bytes, keys or load to spread them over the other groups", "removal")
	dry := fs.Bool("dry-run", false, "print the plan of the moves and stop")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *id == 0 || fs.NArg() != 0 {
		return usageError{errors.New("remove-group needs --id G")}
	}
	if err := checkRebalanceFlags(0, *rf.by, 0, 0, *rf.sample, *rf.page, *rf.maxPause); err != nil {
		return usageError{err}
	}
	ctx, cancel := rf.context()
	defer cancel()
	rm := &cluster.GroupRemoval{
		Group:      cluster.GroupID(*id),
		Rebalancer: rf.rebalancer("remove-group", mover, stderr),
		Logf:       func(format string, a ...any) { fmt.Fprintf(stderr, "kefir cluster: "+format+"\n", a...) },
		Meta: func(f func(mv *cluster.Mover) error) error {
			mv := mover()
			defer mv.Close()
			mv.RetryFor = 10 * time.Second
			return f(mv)
		},
		Weigh: func(ctx context.Context, cm *kv.ClusterMap) ([]cluster.PlanGroup, []int64, error) {
			mv := mover()
			defer mv.Close()
			mv.Page = *rf.page
			return rf.weighSlots(ctx, mv, cm)
		},
		Pause: func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(*rf.lease):
				return nil
			}
		},
		InFlight: func(rec kv.MapMove) error {
			if *dry {
				return fmt.Errorf("remove-group: a move is in flight (slots %s from group %d to group %d): finish or abort it first", cluster.FormatSlotRanges(rec.Slots), rec.From, rec.To)
			}
			return nil
		},
		Planned: func(cm *kv.ClusterMap, own int, plan cluster.Plan) bool {
			fmt.Fprintf(stdout, "group %d owns %d slots at map epoch %d; moving them by %s:\n%s", *id, own, cm.Epoch, *rf.by, plan)
			return !*dry
		},
		Moved: func(done []cluster.RebalanceMove) {
			for _, m := range done {
				if m.Result.Epoch != 0 {
					fmt.Fprintf(stdout, "moved %d-%d from group %d to group %d at epoch %d in %v\n", m.Slots.Start, m.Slots.End, m.From, m.To, m.Result.Epoch, m.Result.Total.Round(time.Millisecond))
				}
			}
		},
		Empty: func(cm *kv.ClusterMap) bool {
			if *dry {
				fmt.Fprintf(stdout, "group %d owns no slots: it would be removed from the map at epoch %d\n", *id, cm.Epoch)
			}
			return !*dry
		},
	}
	epoch, cm, stopped, err := rm.Run(ctx)
	switch {
	case errors.Is(err, cluster.ErrRemovedAlready):
		_, err = fmt.Fprintf(stdout, "group %d is not in the map (removed; map epoch %d)\n", *id, cm.Epoch)
		return err
	case err != nil || stopped:
		return err
	}
	_, err = fmt.Fprintf(stdout, "group %d is removed from the map at epoch %d; its members %v retire their replicas as they see it\n", *id, epoch, cluster.GroupMembersOf(cm, cluster.GroupID(*id)))
	if empty := cluster.EmptiedBy(cm, uint64(*id)); err == nil && len(empty) > 0 {
		_, err = fmt.Fprintf(stdout, "nodes %v are in no other group: they stay up, empty (add-group --members or replace-node can place replicas on them)\n", empty)
	}
	return err
}

// exitStuck is kefir cluster rebalance's exit status when the groups are
// not balanced and the planner has no move that helps (a slot heavier than
// the gap): the command did nothing, which a script should not read as
// success; 1 is a failure to reach the cluster or a move's, 2 a usage error.
const exitStuck = 3

// stuckStatus is the outcome of a plan that runs no move: exitStuck if the
// groups are not balanced (a dry run reports the plan only: nil).
func stuckStatus(plan cluster.Plan, dry bool) error {
	if !dry && len(plan.Moves) == 0 && !plan.Balanced {
		return exitStatus(exitStuck)
	}
	return nil
}

// checkRebalanceFlags refuses what the planner or the mover would take
// silently wrong: a NaN or infinite tolerance (it broke --json), a negative
// or too large --max-moves (they became 64), a page whose STATS limit (8
// pages) would overflow or that the server caps anyway.
func checkRebalanceFlags(nargs int, by string, tolerance float64, maxMoves int, sample time.Duration, page int, maxPause time.Duration) error {
	switch {
	case nargs != 0:
		return errors.New("rebalance takes flags only")
	case by != cluster.ByBytes && by != cluster.ByKeys && by != cluster.ByLoad:
		return fmt.Errorf("--by %q: bytes, keys or load", by)
	case math.IsNaN(tolerance) || math.IsInf(tolerance, 0) || tolerance < 0:
		return fmt.Errorf("--tolerance %v: a finite fraction >= 0", tolerance)
	case maxMoves < 0 || maxMoves > cluster.MaxPlannedMoves:
		return fmt.Errorf("--max-moves %d: 0 (the planner's bound) to %d", maxMoves, cluster.MaxPlannedMoves)
	case by == cluster.ByLoad && sample <= 0:
		return fmt.Errorf("--sample %v: --by load needs a sample > 0", sample)
	case page <= 0 || page > 1<<16:
		return fmt.Errorf("--page %d: 1 to 65536 keys", page)
	case maxPause <= 0:
		return fmt.Errorf("--max-pause %v: > 0", maxPause)
	}
	return nil
}

// runClusterStatus runs `kefir cluster status`: the metadata group's map
// (epoch, nodes, groups with their slot ranges and leaders, moves in
// flight with their drivers), as its leader holds it.
func runClusterStatus(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	asJSON := fs.Bool("json", false, "print the map as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	mv := mover()
	mv.RetryFor = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := mv.Status(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(st)
	}
	_, err = io.WriteString(stdout, st.String())
	return err
}

// runClusterAddNode runs `kefir cluster add-node`: the node joins the
// metadata group's map (no group yet: it would get replicas by a group's
// reconfiguration and slots by moves, which are still to come).
func runClusterAddNode(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster add-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	id := fs.Uint64("id", 0, "the new node's id")
	client := fs.String("client-addr", "", "the new node's client address (host:port)")
	peer := fs.String("peer-addr", "", "the new node's peer address (host:port)")
	zone := fs.String("zone", "", "the node's failure domain (a rack, an availability zone: a short printable label): placement puts a group's replicas in distinct zones. Given for a node of the map (the same addresses), it sets that node's zone")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *id == 0 || *client == "" || *peer == "" || fs.NArg() != 0 {
		return usageError{errors.New("add-node needs --id, --client-addr and --peer-addr")}
	}
	if err := kv.ValidZone(*zone); err != nil {
		return usageError{fmt.Errorf("add-node --zone: %w", err)}
	}
	mv := mover()
	mv.RetryFor = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	epoch, err := mv.AddNode(ctx, *id, *client, *peer, *zone)
	if err != nil {
		return err
	}
	if *zone != "" {
		_, err = fmt.Fprintf(stdout, "node %d is in the map in zone %s at epoch %d\n", *id, *zone, epoch)
		return err
	}
	_, err = fmt.Fprintf(stdout, "node %d is in the map at epoch %d (in no group yet)\n", *id, epoch)
	return err
}

// runClusterAddGroup runs `kefir cluster add-group --members A,B,C`: a
// new data group on nodes already in the map (add-node), recorded in the
// metadata group's map (kv.KindMapAddGroup) with no slots; its members,
// following the map, start its replicas (bootstrapped from the record).
// Without --members its --replicas members are placed on the map's live
// nodes (cluster.PlaceGroup). Checked against the map before anything
// changes. A rerun after a crash finds the group it added (the same
// members, or for a placed group one with no slots, never reconfigured,
// of --replicas members: planAddGroupPlaced) and only waits.
func runClusterAddGroup(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster add-group", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	membersFlag := fs.String("members", "", "the new group's members: node ids of the map, comma-separated, in leader order (an odd number); none: --replicas members placed on the map's live nodes, the least loaded first")
	replicas := fs.Int("replicas", 3, "without --members: the new group's number of replicas (odd for a VR group), placed on that many distinct live nodes of the map, each in a zone the group has no replica in yet if one is left (else in one with the fewest), then the one hosting the fewest replicas (ties to the lower id)")
	idFlag := fs.Uint64("id", 0, "the new group's id (default: one above the map's highest)")
	engine := fs.String("engine", "vr", "the group's replication engine: vr, or chain (chain replication, head first in --members; its master runs at the metadata group's nodes)")
	wait := fs.Duration("wait", 30*time.Second, "wait this long for the new group to have a leader (0: do not wait)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != 0 {
		return usageError{errors.New("add-group takes flags only: --members A,B,C, or --replicas R to place the group")}
	}
	placed := *membersFlag == ""
	if placed && *replicas < 1 {
		return usageError{fmt.Errorf("add-group: --replicas %d: at least 1", *replicas)}
	}
	eng := kv.EngineVR
	switch *engine {
	case "vr":
	case "chain":
		eng = kv.EngineChain
	default:
		return usageError{fmt.Errorf("add-group: --engine %q: vr or chain", *engine)}
	}
	var members []uint64
	if !placed {
		for _, f := range strings.Split(*membersFlag, ",") {
			id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil || id == 0 {
				return usageError{fmt.Errorf("add-group: member %q is not a node id", f)}
			}
			members = append(members, id)
		}
	}
	explicitReplicas := false
	fs.Visit(func(fl *flag.Flag) { explicitReplicas = explicitReplicas || fl.Name == "replicas" })
	if !placed && explicitReplicas && *replicas != len(members) {
		return usageError{fmt.Errorf("add-group: --replicas %d but --members names %d nodes: give one or the other", *replicas, len(members))}
	}
	mv := mover()
	mv.RetryFor = 10 * time.Second
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+*wait)
	defer cancel()
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return fmt.Errorf("add-group: the cluster map: %w", err)
	}
	var id uint64
	var again bool
	if placed {
		// Asked lazily: a rerun that finds its group pings nobody.
		var up map[uint64]bool
		live := func() func(uint64) bool {
			up = cluster.LiveNodes(ctx, mv, cm, 0)
			return func(id uint64) bool { return up[id] }
		}
		id, members, again, err = planAddGroupPlaced(cm, *replicas, *idFlag, eng, live)
		if err == nil && !again {
			fmt.Fprintf(stderr, "kefir cluster: placing the new group's %d replicas on nodes %v%s\n", *replicas, members, cluster.ZoneNote(cm, cluster.GroupChange{Members: members}))
			silentNote(stderr, cm, up, "--members")
		}
	} else {
		id, again, err = planAddGroup(cm, members, *idFlag, eng)
	}
	if err != nil {
		return fmt.Errorf("add-group: %w; nothing changed", err)
	}
	if again && placed {
		fmt.Fprintf(stderr, "kefir cluster: group %d (members %v) is in the map already, never reconfigured: taken as this command's earlier run (to add another group before giving this one slots, name it with --id)\n", id, members)
	}
	epoch := cm.Epoch
	if !again {
		if epoch, err = mv.AddGroup(ctx, cluster.GroupID(id), members, eng); err != nil {
			return err
		}
	}
	kind := ""
	if eng == kv.EngineChain {
		kind = " (chain)"
	}
	fmt.Fprintf(stdout, "group %d%s with members %v is in the map at epoch %d (no slots yet: kefir cluster rebalance or move-slots gives it some)\n", id, kind, members, epoch)
	if *wait <= 0 {
		return nil
	}
	// Its members start it when they see the map: wait until one answers
	// with a leader, so that a rebalance run next finds the group serving.
	var seeds []string
	for _, n := range cm.Nodes {
		if slices.Contains(members, n.ID) {
			seeds = append(seeds, n.ClientAddr)
		}
	}
	deadline := time.Now().Add(*wait)
	for {
		gmv := &cluster.Mover{Seeds: seeds, Password: mv.Password, TLS: mv.TLS, RetryFor: time.Second}
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		gc, err := gmv.GroupConfigOf(gctx, cluster.GroupID(id))
		gcancel()
		gmv.Close()
		if err == nil && gc.Leader != 0 && eng == kv.EngineChain {
			// A chain's members name its head from the configuration
			// whether or not the head runs yet: ask the head itself.
			err = chainHeadRuns(ctx, cm, mv, cluster.GroupID(id), gc.Leader)
		}
		if err == nil && gc.Leader != 0 {
			_, err = fmt.Fprintf(stdout, "group %d is running: %s, leader %d\n", id, gc, gc.Leader)
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("add-group: group %d is in the map, but no member answered with a leader within %s (are nodes %v running? they start the group when they see the map): %v", id, *wait, members, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// chainHeadRuns asks head, chain group g's head, for its configuration:
// nil once its own member answers as the head (a node that does not host
// the group yet answers -MOVED, followed to itself until the retry bound).
func chainHeadRuns(ctx context.Context, cm *kv.ClusterMap, mv *cluster.Mover, g cluster.GroupID, head uint64) error {
	i := slices.IndexFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == head })
	if i < 0 {
		return fmt.Errorf("the chain's head %d is not a node of the map", head)
	}
	hmv := &cluster.Mover{Seeds: []string{cm.Nodes[i].ClientAddr}, Password: mv.Password, TLS: mv.TLS, RetryFor: 500 * time.Millisecond}
	defer hmv.Close()
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	gc, err := hmv.GroupConfigOf(hctx, g)
	if err != nil {
		return fmt.Errorf("the chain's head %d: %w", head, err)
	}
	if gc.Leader != head {
		return fmt.Errorf("the chain's head %d names %d", head, gc.Leader)
	}
	return nil
}

// planAddGroup checks an add-group of members (and id, 0: the next) against
// cm and returns the group's id; again: the map has that group already (a
// rerun), nothing to record.
func planAddGroup(cm *kv.ClusterMap, members []uint64, id uint64, engine string) (gid uint64, again bool, err error) {
	if engine != kv.EngineChain && len(members)%2 == 0 {
		// A chain runs with any number (f+1 members survive f failures).
		return 0, false, fmt.Errorf("%d members: a VR group needs an odd number (2f+1)", len(members))
	}
	for i, m := range members {
		if slices.Contains(members[:i], m) {
			return 0, false, fmt.Errorf("member %d listed twice", m)
		}
		if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == m }) {
			return 0, false, fmt.Errorf("node %d is not a node of the cluster map (kefir cluster add-node it first)", m)
		}
	}
	if id != 0 {
		if id >= kv.MetaGroup {
			return 0, false, fmt.Errorf("group id %d: data groups' ids are 1 to %d", id, kv.MetaGroup-1)
		}
		if slices.Contains(cm.Removed, id) {
			return 0, false, fmt.Errorf("group %d was removed from the cluster: a new group needs another id", id)
		}
		if g, ok := cm.Group(id); ok {
			if g.MemberEpoch == 0 && slices.Equal(g.Members, members) && g.Engine == engine {
				return id, true, nil
			}
			return 0, false, fmt.Errorf("group %d is in the map already, with members %v", id, g.Members)
		}
		return id, false, nil
	}
	for _, g := range cm.Groups {
		if g.MemberEpoch == 0 && len(g.Slots) == 0 && slices.Equal(g.Members, members) && g.Engine == engine {
			return g.ID, true, nil // added by an earlier run
		}
		id = max(id, g.ID)
	}
	if len(cm.Removed) > 0 {
		id = max(id, slices.Max(cm.Removed)) // never a removed group's id
	}
	if id+1 >= kv.MetaGroup {
		return 0, false, fmt.Errorf("no group id left below %d", kv.MetaGroup)
	}
	return id + 1, false, nil
}

// planAddGroupPlaced is planAddGroup for a group placed by the command
// (add-group without --members): r replicas on the map's live nodes
// (cluster.PlaceGroup; live is asked only if a placement is needed),
// unless the map has a group an earlier run added (cluster.PlacedEarlier:
// a rerun must not place the group a second time).
func planAddGroupPlaced(cm *kv.ClusterMap, r int, id uint64, engine string, live func() func(uint64) bool) (gid uint64, members []uint64, again bool, err error) {
	if engine != kv.EngineChain && r%2 == 0 {
		return 0, nil, false, fmt.Errorf("--replicas %d: a VR group needs an odd number (2f+1)", r)
	}
	if g, ok := cluster.PlacedEarlier(cm, r, id, engine); ok {
		return g.ID, slices.Clone(g.Members), true, nil
	}
	if members, err = cluster.PlaceGroup(cm, r, live()); err != nil {
		return 0, nil, false, err
	}
	gid, again, err = planAddGroup(cm, members, id, engine)
	return gid, members, again, err
}

// clusterConnFlags defines the flags every kefir cluster command reaches
// the cluster with (--addr, --password, --tls, --tls-insecure) and returns
// the Mover they make, to call after fs.Parse.
func clusterConnFlags(fs *flag.FlagSet) func() *cluster.Mover {
	addrs := fs.String("addr", envOr("KEFIR_ADDR", "127.0.0.1:6380"), "client addresses of nodes of the cluster, comma-separated (env KEFIR_ADDR)")
	password := fs.String("password", "", "password (env KEFIR_PASSWORD)")
	useTLS := fs.Bool("tls", false, "connect with TLS")
	insecure := fs.Bool("tls-insecure", false, "with --tls, do not verify the server certificate")
	return func() *cluster.Mover {
		if *password == "" {
			*password = os.Getenv("KEFIR_PASSWORD")
		}
		mv := &cluster.Mover{Seeds: strings.Split(*addrs, ","), Password: *password}
		if *useTLS {
			mv.TLS = &tls.Config{InsecureSkipVerify: *insecure} //nolint:gosec // the user's choice
		}
		return mv
	}
}

// runClusterMembers runs `kefir cluster replace-node --old N --new
// ID@PEER-ADDR/CLIENT-ADDR` and `kefir cluster remove-node --id N[,M]`
// (docs/cluster.md, "Replacing a failed node"): it asks the group (any
// member's client address) for its configuration, checks the change
// (replace-node: N a member, the new id not one; remove-node: an odd,
// non-empty remainder) before anything changes, and asks the leader
// (following redirects) to reconfigure: KEFIR.GROUP RECONFIG. It prints
// the new epoch and members.
func runClusterMembers(cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir cluster "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	mover := clusterConnFlags(fs)
	old := fs.Uint64("old", 0, "replace-node: the member to replace (its node may be down)")
	nw := fs.String("new", "", "replace-node: the new member as ID@PEER-ADDR/CLIENT-ADDR (start it with kefir server --join, before or after; none in a cluster of several groups: the map's live nodes take the old node's replicas); add-members: the new members, comma-separated (a node of the map by its id alone)")
	ids := fs.String("id", "", "remove-node: the members to remove, comma-separated")
	replicas := fs.Int("replicas", 0, "add-members without --new, in a cluster of several groups: grow the group to this many members (a VR group's odd; a chain's any), the new ones placed on the map's live nodes not in it, each the one hosting the fewest replicas (ties to the lower id); a rerun once the group has them does nothing")
	timeout := fs.Duration("timeout", time.Minute, "deadline for the whole command")
	asJSON := fs.Bool("json", false, "print the new configuration as JSON")
	force := fs.Bool("force", false, "change a group even if the members its last change added have not caught up with it yet (by default the command waits --catch-up-wait for them, then refuses)")
	catchUp := fs.Duration("catch-up-wait", cluster.CaughtUpWait, "how long to wait for the members a group's last change added to pull its state before changing it again")
	only := fs.Uint64("group", 0, "a cluster of several groups: replace-node/remove-node change only this data group (0: every group the node is in; a rerun without it finishes the rest); add-members: the group to grow (65535: the metadata group)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != 0 {
		return usageError{fmt.Errorf("%s takes flags only", cmd)}
	}
	if *replicas != 0 && cmd != "add-members" {
		// Not taken silently: replace-node keeps each group's size.
		return usageError{fmt.Errorf("%s: --replicas is add-members' (a group's size to grow to)", cmd)}
	}
	var change func(cluster.GroupConfig) ([]cluster.Member, error)
	var newNode cluster.Member
	var removed []uint64
	var added []cluster.Member
	switch cmd {
	case "add-members":
		if (*nw == "") == (*replicas == 0) || *old != 0 || *ids != "" {
			return usageError{errors.New("add-members needs --new ID[@PEER-ADDR/CLIENT-ADDR][,...], or --replicas N to place the new members (and --group G in a cluster of several groups)")}
		}
		if *replicas != 0 {
			if *replicas < 0 {
				return usageError{fmt.Errorf("--replicas %d: a group's size (a VR group's odd, 2f+1; a chain's any, at least 1)", *replicas)}
			}
			change = func(cluster.GroupConfig) ([]cluster.Member, error) {
				return nil, errors.New("a single group's nodes are all its members: name the new nodes with --new ID@PEER-ADDR/CLIENT-ADDR,... (start them with kefir server --join)")
			}
			break
		}
		for _, f := range strings.Split(*nw, ",") {
			m, err := cluster.ParseMember(f)
			if err != nil {
				return usageError{fmt.Errorf("--new %q: %w", *nw, err)}
			}
			added = append(added, m)
		}
		change = func(c cluster.GroupConfig) ([]cluster.Member, error) { return cluster.AddMembers(c, added) }
	case "replace-node":
		if *old == 0 || *ids != "" {
			return usageError{errors.New("replace-node needs --old N (and --new ID@PEER-ADDR/CLIENT-ADDR, or none in a cluster of several groups: the map's nodes take its replicas)")}
		}
		if *nw == "" {
			// Placed on the map's nodes (groupsChange); a single group
			// has no node that is not a member already.
			change = func(cluster.GroupConfig) ([]cluster.Member, error) {
				return nil, errors.New("a single group's nodes are all its members: name a new node with --new ID@PEER-ADDR/CLIENT-ADDR (start it with kefir server --join)")
			}
			break
		}
		m, err := cluster.ParseMember(*nw)
		if err != nil || m.PeerAddr == "" {
			return usageError{fmt.Errorf("--new %q: want ID@PEER-ADDR/CLIENT-ADDR", *nw)}
		}
		newNode = m
		change = func(c cluster.GroupConfig) ([]cluster.Member, error) { return cluster.ReplaceMembers(c, *old, m) }
	default:
		if *ids == "" || *old != 0 || *nw != "" {
			return usageError{errors.New("remove-node needs --id N[,M...]")}
		}
		var rm []uint64
		for _, f := range strings.Split(*ids, ",") {
			id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil || id == 0 {
				return usageError{fmt.Errorf("--id %q: positive node ids, comma-separated", *ids)}
			}
			rm = append(rm, id)
		}
		removed = rm
		change = func(c cluster.GroupConfig) ([]cluster.Member, error) { return cluster.RemoveMembers(c, rm) }
	}
	mv := mover()
	defer mv.Close()
	mv.RetryFor = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// A cluster of several groups has a metadata group's map: each of the
	// node's groups is reconfigured in turn (groupsChange).
	if cm, err := mv.MetaMap(ctx); err == nil {
		catch := *catchUp
		if *force {
			catch = -1
		}
		if cmd == "add-members" && *replicas != 0 {
			news, err := placeMembers(ctx, mv, cm, cluster.GroupID(*only), *replicas, *asJSON, stdout, stderr)
			if err != nil || news == nil {
				return err // or nothing left to do, said
			}
			added = news
		}
		return groupsChange(ctx, cmd, mv, cm, *old, newNode, removed, added, *replicas, cluster.GroupID(*only), catch, *asJSON, stdout, stderr)
	} else if !strings.Contains(err.Error(), "needs a node of several groups") {
		return fmt.Errorf("%s: cannot get the group's configuration from %s (nor the cluster map): %w; nothing changed", cmd, strings.Join(mv.Seeds, ","), err)
	}
	cur, err := mv.GroupConfig(ctx)
	if err != nil {
		return fmt.Errorf("%s: cannot get the group's configuration from %s: %w; nothing changed", cmd, strings.Join(mv.Seeds, ","), err)
	}
	members, err := change(cur)
	if err != nil {
		return fmt.Errorf("%s: %w; nothing changed", cmd, err)
	}
	if !*force && !cluster.SameIDs(cur.Members, cluster.MemberIDs(members)) {
		leaving := removed
		if cmd == "replace-node" {
			leaving = []uint64{*old}
		}
		logf := func(format string, args ...any) { fmt.Fprintf(stderr, "kefir cluster: "+format+"\n", args...) }
		if err := mv.WaitCaughtUp(ctx, 0, cur.Members, cur.Previous, leaving, *catchUp, logf); err != nil {
			return fmt.Errorf("%s: %w; nothing changed", cmd, err)
		}
	}
	fmt.Fprintf(stderr, "kefir cluster: the group is at %s\n", cur)
	mv.RetryFor = 30 * time.Second
	// From the configuration the change was planned against: one that
	// landed meanwhile (during the catch-up wait) is refused, not undone.
	res, err := mv.Reconfigure(ctx, cur.Epoch, members)
	if moved := (*cluster.EpochMovedError)(nil); errors.As(err, &moved) {
		if moved.Pending {
			return fmt.Errorf("%s: another change of the group is under way (to epoch %d, members %v, not committed yet; the command planned against epoch %d); nothing changed by this one: rerun the command once it settles", cmd, moved.Epoch, moved.Members, moved.Expected)
		}
		return fmt.Errorf("%s: the group changed while the command ran (now epoch %d, members %v; it planned against epoch %d); nothing changed: rerun the command to plan against the group as it is now", cmd, moved.Epoch, moved.Members, moved.Expected)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"epoch": res.Epoch, "members": res.Members, "previous": res.Previous,
			"epoch_start": res.Start})
	}
	_, err = fmt.Fprintf(stdout, "the group is at %s (previous members %v)\n", res, res.Previous)
	return err
}

// groupsChange is replace-node, remove-node and add-members in a cluster
// of several groups (docs/cluster.md, "Replacing a failed node"): it plans
// the change against the metadata group's map (cluster.PlanNodeChange,
// PlanReplacePlaced, PlanRemoveNodes, PlanAddMembers), which refuses what
// is wrong before anything changes, and runs the plan with
// cluster.NodeChange, the one copy of the loop the metadata leader's
// repairer runs too. Every step is idempotent, so a rerun after a crash
// (of this command or of a node) finishes the job.
func groupsChange(ctx context.Context, cmd string, mv *cluster.Mover, cm *kv.ClusterMap, old uint64, nw cluster.Member, removed []uint64,
	added []cluster.Member, grow int, only cluster.GroupID, catchUp time.Duration, asJSON bool, stdout, stderr io.Writer) error {
	var plan []cluster.GroupChange
	var newNodes []cluster.Member // nodes to record in the map first
	var err error
	switch cmd {
	case "remove-node":
		plan, err = cluster.PlanRemoveNodes(cm, removed)
	case "add-members":
		if only == 0 {
			return usageError{errors.New("add-members in a cluster of several groups needs --group G (65535: the metadata group)")}
		}
		var ch cluster.GroupChange
		ch, newNodes, err = cluster.PlanAddMembers(cm, only, added)
		if !ch.Chain {
			ch.Size = grow // --replicas: a size to grow to, not these nodes in
		}
		if len(ch.Members) > 0 {
			plan = []cluster.GroupChange{ch}
		}
	default:
		if nw.ID != 0 {
			plan, err = cluster.PlanNodeChange(cm, old, nw)
			newNodes = []cluster.Member{nw}
			break
		}
		// No --new: the map's live nodes take old's replicas, each group
		// the least loaded node not in it (cluster.PlanReplacePlaced);
		// with --group, that group's step chosen alone, as it runs.
		live := cluster.LiveNodes(ctx, mv, cm, old)
		plan, err = cluster.PlanReplacePlacedStep(cm, old, func(id uint64) bool { return live[id] }, only)
		for _, ch := range plan {
			if on := cluster.PlacedOn(cm, ch, old); err == nil && on != 0 {
				fmt.Fprintf(stderr, "kefir cluster: placing node %d's replica of %s on node %d%s\n", old, cluster.GroupName(ch.Group), on, cluster.ZoneNote(cm, ch))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w; nothing changed", cmd, err)
	}
	if only != 0 && cmd != "add-members" {
		i := slices.IndexFunc(plan, func(c cluster.GroupChange) bool { return c.Group == only })
		if i < 0 {
			return fmt.Errorf("%s: group %d does not change (map epoch %d); nothing changed", cmd, only, cm.Epoch)
		}
		plan = plan[i : i+1]
	}
	leaving := removed
	if cmd == "replace-node" {
		leaving = []uint64{old}
	}
	var out []cluster.StepDone
	nc := &cluster.NodeChange{Cmd: cmd, Meta: mv, Leaving: leaving, NewNodes: newNodes, CatchUp: catchUp,
		Logf: func(format string, a ...any) { fmt.Fprintf(stderr, "kefir cluster: "+format+"\n", a...) },
		Done: func(d cluster.StepDone) {
			out = append(out, d)
			switch {
			case asJSON:
			case d.Chain:
				fmt.Fprintf(stdout, "chain group %d is %v (head first); map epoch %d\n", d.Group, d.Members, d.MapEpoch)
			default:
				fmt.Fprintf(stdout, "group %d is at epoch %d, members %v (previous %v); map epoch %d\n", d.Group, d.Epoch, d.Members, d.Previous, d.MapEpoch)
			}
		}}
	if err := nc.Run(ctx, cm, plan); err != nil {
		return err
	}
	if cmd == "remove-node" {
		// Out of every group: out of the map too, and each node, seeing
		// a map without itself, retires. A node that still hosts a group
		// (--group took it out of one; or a group it is in was not in
		// the plan) stays, said so: the removal that worked is done (exit
		// 0), and the map refuses the rest. A chain's master may still be
		// taking it out of the chain: then it stays too, said so.
		now, err := mv.MetaMap(ctx)
		if err != nil {
			now = nil // the map's refusal answers for it
		}
		note := stdout
		if asJSON {
			note = stderr
		}
		for _, id := range removed {
			if why := stillHosts(now, id); why != "" {
				fmt.Fprintf(note, "node %d still hosts %s: the map keeps it (remove-node --id %d without --group takes it out of every group, then of the map)\n", id, why, id)
				continue
			}
			epoch, err := mv.RemoveNode(ctx, id)
			switch {
			case err != nil:
				fmt.Fprintf(stderr, "kefir cluster: node %d stays in the map's node list for now (%v): run remove-node --id %d again later\n", id, err, id)
			case !asJSON:
				fmt.Fprintf(stdout, "node %d is out of the map at epoch %d: it retires\n", id, epoch)
			}
		}
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(out)
	}
	if len(plan) == 0 && cmd == "add-members" {
		_, err := fmt.Fprintf(stdout, "group %d already has those members: nothing left to do\n", only)
		return err
	}
	if len(plan) == 0 && cmd != "remove-node" {
		_, err := fmt.Fprintf(stdout, "node %d is in no group any more: nothing left to do\n", old)
		return err
	}
	return nil
}

// stillHosts names the groups that still host node id in map cm ("group 2
// and the metadata group"), or "" when none does (or cm is nil: unknown):
// kv.ClusterMap.NodeGroups, the map's own check. A chain group that lists
// it only as leaving (its master took it out of the chain, and keeps it
// listed so as to refuse it should it come back) does not host it: the
// removal takes the entry out with the node.
func stillHosts(cm *kv.ClusterMap, id uint64) string {
	if cm == nil {
		return ""
	}
	gs, meta := cm.NodeGroups(id)
	var names []string
	for _, g := range gs {
		names = append(names, strconv.FormatUint(g, 10))
	}
	var parts []string
	switch len(names) {
	case 0:
	case 1:
		parts = append(parts, "group "+names[0])
	default:
		parts = append(parts, "groups "+strings.Join(names, ", "))
	}
	if meta {
		parts = append(parts, "the metadata group")
	}
	return strings.Join(parts, " and ")
}

// placeMembers is add-members --replicas r without --new in a cluster of
// several groups: the nodes that grow group g of cm to r members, placed
// on the map's live nodes (cluster.PlaceMembers), or nil once it has them
// (said on stdout, as JSON with asJSON). A rerun must not place them a
// second time: if the group's own configuration has r members, the map's
// and others — it grew before the map said so (its leader records it
// within a second) — the others are the earlier run's choice and are asked
// for again (the reconfiguration is then a no-op), as cluster.NodeChange
// does for replace-node (rebaseChange).
func placeMembers(ctx context.Context, mv *cluster.Mover, cm *kv.ClusterMap, g cluster.GroupID, r int, asJSON bool, stdout, stderr io.Writer) ([]cluster.Member, error) {
	if g == 0 {
		return nil, usageError{errors.New("add-members in a cluster of several groups needs --group G (65535: the metadata group)")}
	}
	ms := cluster.GroupMembersOf(cm, g)
	chain, joining := false, false
	if mg, ok := cm.Group(uint64(g)); ok && mg.IsChain() {
		// A chain counts the nodes the map wants in as members, and a
		// rerun while they join asks for them again (PlaceMembers). Its
		// group's own configuration says nothing of an earlier run (the
		// map's wish is all there is) and may name a failed member its
		// master dropped: never taken for a growth.
		ms, chain, joining = cluster.ChainWanted(*mg), true, len(mg.Joining) > 0
	}
	switch {
	case joining:
	case len(ms) > r:
		return nil, fmt.Errorf("add-members: group %d has %d members %v, more than --replicas %d (remove-node shrinks a group); nothing changed", g, len(ms), ms, r)
	case len(ms) == r && asJSON:
		// As groupsChange's --json when nothing changes: no group done.
		return nil, json.NewEncoder(stdout).Encode([]any(nil))
	case len(ms) == r:
		_, err := fmt.Fprintf(stdout, "group %d has %d members %v already: nothing left to do\n", g, r, ms)
		return nil, err
	}
	var ids []uint64
	if !chain {
		if cur, err := mv.GroupConfigOf(ctx, g); err == nil {
			ids = grownAlready(ms, cur.Members, r)
		}
	}
	if ids != nil {
		fmt.Fprintf(stderr, "kefir cluster: %s has grown to %v already (the map does not say so yet): recording it\n", cluster.GroupName(g), slices.Concat(ms, ids))
	} else {
		live := cluster.LiveNodes(ctx, mv, cm, 0)
		var err error
		if ids, err = cluster.PlaceMembers(cm, g, r, func(id uint64) bool { return live[id] }); err != nil {
			return nil, fmt.Errorf("add-members: %w; nothing changed", err)
		}
		fmt.Fprintf(stderr, "kefir cluster: placing %s's new members on nodes %v%s\n", cluster.GroupName(g), ids, cluster.ZoneNote(cm, cluster.GroupChange{Members: slices.Concat(ms, ids)}))
		silentNote(stderr, cm, live, "--new")
	}
	news := make([]cluster.Member, len(ids))
	for i, id := range ids {
		news[i] = cluster.Member{ID: id}
	}
	return news, nil
}

// silentNote tells the operator of a placement which nodes of cm it could
// not consider (cluster.Silent over up, the nodes that answered), and that
// flag names nodes whatever they answer.
func silentNote(w io.Writer, cm *kv.ClusterMap, up map[uint64]bool, flag string) {
	if ids := cluster.Silent(cm, func(id uint64) bool { return up[id] }); len(ids) > 0 {
		fmt.Fprintf(w, "kefir cluster: nodes %v host no replica and do not answer, so none was placed there (start them, or name the nodes you want with %s)\n", ids, flag)
	}
}

// grownAlready is what a placed add-members' rerun asks for again: the
// members of the group's own configuration cur beyond the map's ms, if cur
// has r members and every one of ms — the group grew to r before the map
// said so, and those are the earlier run's choice; nil otherwise (place).
func grownAlready(ms, cur []uint64, r int) []uint64 {
	if len(cur) != r || len(cur) <= len(ms) || slices.ContainsFunc(ms, func(id uint64) bool { return !slices.Contains(cur, id) }) {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(cur), func(id uint64) bool { return slices.Contains(ms, id) })
}
