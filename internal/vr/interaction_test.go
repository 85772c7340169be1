package vr

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// Interaction tests: protocol scenarios written as datadriven scripts
// (testdata/*.txt), after etcd raft's rafttest.InteractionEnv. A script
// drives a group of cores by hand through the harness of replica_test.go
// (tnet: one clock, a message queue, Ready performed as doc.go prescribes,
// each applied entry's result "r<op>") and prints every Ready, every
// delivered message and every fsync, so the expected output reads as a
// trace of the protocol. Regenerate after a deliberate change with
//
//	go test ./internal/vr/ -run TestInteraction -rewrite
//
// and read the diff: it is the protocol's behaviour that changed.
//
// Commands (ids are replica ids, 1-based; "ids" lists default to every
// replica that is up):
//
//	add-nodes <n> [sync=auto|manual] [follower-reads] [nilext] [no-lease]
//	    a bootstrapped group (replica 1 leads view 0); its first Ready is
//	    performed quietly. sync=manual: fsyncs happen only on "persist".
//	tick [ids] [ms=10]       advance the clock, Tick the replicas
//	process-ready [ids]      perform and print the replicas' Readys
//	deliver-msgs [from=] [to=] [type=a,b] [drop]
//	                         step (or drop) the queued messages that match
//	persist [ids]            fsync: report the latest persist seq
//	stabilize [ids]          process-ready and deliver until quiet
//	heartbeats [n=1]         n rounds of: tick 10 ms, stabilize
//	propose id= client= req= [ack=replicated|appended] <words...>
//	nilext client= req= [to=a,b] [sync] key=<k> <words...>
//	nilext-status client= req=  the client's view of a nilext update's acks
//	read id= level=linearizable|lease|index|durable|follower|nilext [op=] [key=]
//	compact id= op=          drop the log up to op (a snapshot holds it)
//	send-snapshot id= to=    answer SnapshotNeeded with the applied state
//	cut from= to= / heal from= to=
//	                         a one-way link loses (or again carries) messages
//	crash id=                the replica stops; messages to it are lost
//	restart id= [wipe]       a new core from its intact disk (everything
//	                         synced; no nilext d-log), or from an empty one
//	                         (wipe: State.LostState, the recovery protocol)
//	reconfigure id= members=a,b,c
//	                         Reconfigure at replica id (reconfig.go)
//	add-member id= [from=]   start replica id as a new member of replica
//	                         from's (default: the first up) configuration:
//	                         an empty disk, Membership.Apply
//	status [ids]             each replica's protocol state
//	log-level none|all       none: perform Readys without printing them
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		e := &ienv{t: t, print: true}
		datadriven.RunTest(t, path, e.handle)
	})
}

type ienv struct {
	t       *testing.T
	n       *tnet
	b       strings.Builder
	print   bool
	down    map[uint64]*Replica // crashed replicas, kept for their disk
	downDur map[uint64]bool     // crashed with unsynced writes
	ctx     uint64
	acks    map[[2]uint64][]NilextAck // nilext acks by (client, req)
	ids     []uint64                  // every member, up or down
	cut     map[[2]uint64]bool        // one-way links that lose every message
}

func (e *ienv) handle(t *testing.T, d *datadriven.TestData) string {
	e.t = t
	e.b.Reset()
	if e.n == nil && d.Cmd != "add-nodes" {
		d.Fatalf(t, "add-nodes first")
	}
	if e.n != nil {
		e.n.t = t
	}
	switch d.Cmd {
	case "add-nodes":
		e.addNodes(t, d)
	case "tick":
		d10 := 10
		d.MaybeScanArgs(t, "ms", &d10)
		e.n.now += int64(d10) * ms
		for _, id := range e.idsArg(d) {
			e.n.rs[id].Tick(e.n.now)
		}
		fmt.Fprintf(&e.b, "now=%dms\n", (e.n.now-1000*ms)/ms)
	case "process-ready":
		for _, id := range e.idsArg(d) {
			e.n.ready(id)
		}
	case "deliver-msgs":
		e.deliver(t, d)
	case "persist":
		for _, id := range e.idsArg(d) {
			e.persist(id)
		}
	case "stabilize":
		e.stabilize(e.idsArg(d))
	case "heartbeats":
		k := 1
		d.MaybeScanArgs(t, "n", &k)
		for range k {
			e.n.now += 10 * ms
			if e.print {
				fmt.Fprintf(&e.b, "-- now=%dms\n", (e.n.now-1000*ms)/ms)
			}
			for _, id := range e.up() {
				e.n.rs[id].Tick(e.n.now)
			}
			e.stabilize(e.up())
		}
		fmt.Fprintf(&e.b, "now=%dms\n", (e.n.now-1000*ms)/ms)
	case "propose":
		e.propose(t, d)
	case "nilext":
		e.nilext(t, d)
	case "nilext-status":
		var client, req uint64
		d.ScanArgs(t, "client", &client)
		d.ScanArgs(t, "req", &req)
		tr := NewNilextTracker(e.ids)
		done := false
		var from []string
		for _, a := range e.acks[[2]uint64{client, req}] {
			from = append(from, fmt.Sprintf("%d(v%d%s)", a.From, a.View, map[bool]string{true: ",leader"}[a.Leader]))
			done = tr.Add(a) || done
		}
		fmt.Fprintf(&e.b, "acks from %s; supermajority %d of %d; complete=%t\n",
			strings.Join(from, " "), NilextSupermajority(len(e.ids)), len(e.ids), done)
	case "read":
		e.read(t, d)
	case "crash":
		var id uint64
		d.ScanArgs(t, "id", &id)
		if e.n.rs[id] == nil {
			d.Fatalf(t, "replica %d is not up", id)
		}
		e.down[id] = e.n.rs[id]
		e.downDur[id] = e.n.unsynced[id] != 0
		delete(e.n.rs, id)
		delete(e.n.unsynced, id)
		fmt.Fprintf(&e.b, "%d down\n", id)
	case "restart":
		var id uint64
		d.ScanArgs(t, "id", &id)
		old := e.down[id]
		if old == nil {
			d.Fatalf(t, "replica %d is not down", id)
		}
		delete(e.down, id)
		nonce := id<<40 | uint64(e.n.now)
		if d.HasArg("wipe") {
			// A replaced (empty) disk: the replica may lack what it
			// promised, and runs the recovery protocol (VR §4.3).
			r, err := New(old.cfg, State{LostState: true, Nonce: nonce})
			if err != nil {
				d.Fatalf(t, "restart %d: %v", id, err)
			}
			r.Tick(e.n.now)
			e.n.rs[id] = r
			e.n.ready(id)
			break
		}
		if old.cfg.Nilext {
			// tnet.restart passes no d-log (State.DLog, DLogIntact).
			d.Fatalf(t, "replica %d runs nilext; restart does not model its d-log", id)
		}
		if e.downDur[id] {
			// tnet.restart rebuilds from the old core's memory, which is
			// the disk only if everything was synced.
			d.Fatalf(t, "replica %d crashed with unsynced writes; restart models an intact disk only (or wipe)", id)
		}
		e.n.rs[id] = old
		e.n.restart(id, nonce)
	case "reconfigure":
		var id uint64
		d.ScanArgs(t, "id", &id)
		var ms []uint64
		for _, a := range d.CmdArgs {
			if a.Key == "members" {
				for _, v := range a.Vals {
					m, err := strconv.ParseUint(v, 10, 64)
					if err != nil {
						d.Fatalf(t, "members: %v", err)
					}
					ms = append(ms, m)
				}
			}
		}
		e.result(e.n.rs[id].Reconfigure(e.n.now, AnyEpoch, ms))
	case "add-member":
		var id uint64
		d.ScanArgs(t, "id", &id)
		from := e.up()[0]
		d.MaybeScanArgs(t, "from", &from)
		src := e.n.rs[from].Config()
		cfg := testConfig(id, 3)
		cfg.Cluster, cfg.LeaseDuration = src.Cluster, src.LeaseDuration
		cfg = Membership{Epoch: src.Epoch, Members: src.Members, Start: src.EpochStart, Previous: src.Previous}.Apply(cfg)
		r, err := New(cfg, State{Nonce: id << 40})
		if err != nil {
			d.Fatalf(t, "add-member %d: %v", id, err)
		}
		r.Tick(e.n.now)
		e.n.rs[id] = r
		if !slices.Contains(e.ids, id) {
			e.ids = append(e.ids, id)
			slices.Sort(e.ids)
		}
		e.n.ready(id)
		e.status(id)
	case "status":
		for _, id := range e.idsArg(d) {
			e.status(id)
		}
		if len(e.n.q) > 0 {
			fmt.Fprintf(&e.b, "queued: %d messages\n", len(e.n.q))
		}
	case "compact":
		// The driver captured the state machine at op in a durable
		// snapshot and drops the log up to it.
		var id, op uint64
		d.ScanArgs(t, "id", &id)
		d.ScanArgs(t, "op", &op)
		e.result(e.n.rs[id].Compact(op))
	case "send-snapshot":
		// The driver answers Ready.SnapshotNeeded with its state machine
		// at the applied op (the harness's state is a label).
		var id, to uint64
		d.ScanArgs(t, "id", &id)
		d.ScanArgs(t, "to", &to)
		r := e.n.rs[id]
		s := Snapshot{Op: r.applied, Clients: r.ClientTable(), Data: []byte(fmt.Sprintf("state@%d", r.applied))}
		e.result(r.SendSnapshot(to, s))
	case "cut", "heal":
		var from, to uint64
		d.ScanArgs(t, "from", &from)
		d.ScanArgs(t, "to", &to)
		if d.Cmd == "cut" {
			e.cut[[2]uint64{from, to}] = true
		} else {
			delete(e.cut, [2]uint64{from, to})
		}
	case "log-level":
		switch {
		case d.HasArg("none"):
			e.print = false
		case d.HasArg("all"):
			e.print = true
		default:
			d.Fatalf(t, "log-level none|all")
		}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return e.b.String()
}

func (e *ienv) addNodes(t *testing.T, d *datadriven.TestData) {
	k, err := strconv.Atoi(d.CmdArgs[0].Key)
	if err != nil {
		d.Fatalf(t, "add-nodes <n>: %v", err)
	}
	n := newNetWith(t, k, func(c *Config) {
		if d.HasArg("follower-reads") {
			followerReads(c)
		}
		if d.HasArg("nilext") {
			nilextOn(c)
		}
		if d.HasArg("no-lease") {
			c.LeaseDuration = 0
		}
	})
	sync := "auto"
	d.MaybeScanArgs(t, "sync", &sync)
	n.autoSync = sync == "auto"
	n.onReady = e.onReady
	n.onSync = func(id, seq uint64) {
		if e.print {
			fmt.Fprintf(&e.b, "> %d persisted seq=%d\n", id, seq)
		}
	}
	e.n, e.ids = n, slices.Clone(n.ids)
	e.down, e.downDur, e.acks = map[uint64]*Replica{}, map[uint64]bool{}, map[[2]uint64][]NilextAck{}
	e.cut = map[[2]uint64]bool{}
	for _, id := range e.ids {
		e.status(id)
	}
	if len(n.q) > 0 {
		fmt.Fprintf(&e.b, "queued: %d messages\n", len(n.q))
	}
}

// up lists the replicas that are running, in id order.
func (e *ienv) up() []uint64 {
	var ids []uint64
	for _, id := range e.ids {
		if e.n.rs[id] != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// idsArg reads the bare numeric arguments (or id=) as replica ids; none
// means every replica that is up.
func (e *ienv) idsArg(d *datadriven.TestData) []uint64 {
	var ids []uint64
	for _, a := range d.CmdArgs {
		if a.Key == "id" {
			for _, v := range a.Vals {
				ids = append(ids, e.parseID(d, v))
			}
		} else if len(a.Vals) == 0 {
			if _, err := strconv.ParseUint(a.Key, 10, 64); err == nil {
				ids = append(ids, e.parseID(d, a.Key))
			}
		}
	}
	if len(ids) == 0 {
		return e.up()
	}
	return ids
}

func (e *ienv) parseID(d *datadriven.TestData, s string) uint64 {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || e.n.rs[id] == nil {
		d.Fatalf(e.t, "replica %q is not up", s)
	}
	return id
}

// words joins the bare arguments other than flags: a request's data.
func words(d *datadriven.TestData, flags ...string) string {
	var w []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 && !slices.Contains(flags, a.Key) {
			w = append(w, a.Key)
		}
	}
	return strings.Join(w, " ")
}

func (e *ienv) persist(id uint64) {
	s := e.n.unsynced[id]
	if s == 0 {
		return
	}
	delete(e.n.unsynced, id)
	e.n.onSync(id, s)
	e.n.rs[id].Persisted(s)
}

// deliver steps the queued messages that match the filters, in queue order,
// and leaves the others queued (or drops them, with drop).
func (e *ienv) deliver(t *testing.T, d *datadriven.TestData) {
	var from, to uint64
	var types []string
	d.MaybeScanArgs(t, "from", &from)
	d.MaybeScanArgs(t, "to", &to)
	if a, ok := d.Arg("type"); ok {
		types = a.Vals
	}
	drop := d.HasArg("drop")
	match := func(m Message) bool {
		return (from == 0 || m.From == from) && (to == 0 || m.To == to) &&
			(types == nil || slices.Contains(types, m.Type.String()))
	}
	q := e.n.q
	e.n.q = nil
	for _, m := range q {
		if !match(m) {
			e.n.q = append(e.n.q, m)
			continue
		}
		r := e.n.rs[m.To]
		switch {
		case drop:
			fmt.Fprintf(&e.b, "dropped %s\n", fmtMsg(m))
		case r == nil:
			fmt.Fprintf(&e.b, "lost %s (%d down)\n", fmtMsg(m), m.To)
		case e.cut[[2]uint64{m.From, m.To}]:
			fmt.Fprintf(&e.b, "cut %s\n", fmtMsg(m))
		default:
			fmt.Fprintf(&e.b, "%s\n", fmtMsg(m))
			r.Step(e.n.now, m)
		}
	}
}

// stabilize performs Readys and delivers every message until nothing moves.
// Fsyncs still wait for "persist" with sync=manual.
func (e *ienv) stabilize(ids []uint64) {
	for i := 0; ; i++ {
		if i > 1000 {
			e.t.Fatal("stabilize: the group never quiets")
		}
		for _, id := range ids {
			if e.n.rs[id] != nil {
				e.n.ready(id)
			}
		}
		if len(e.n.q) == 0 {
			return
		}
		q := e.n.q
		e.n.q = nil
		for _, m := range q {
			if e.cut[[2]uint64{m.From, m.To}] {
				if e.print {
					fmt.Fprintf(&e.b, "cut %s\n", fmtMsg(m))
				}
			} else if r := e.n.rs[m.To]; r != nil && slices.Contains(ids, m.To) {
				if e.print {
					fmt.Fprintf(&e.b, "%s\n", fmtMsg(m))
				}
				r.Step(e.n.now, m)
			} else if e.print {
				fmt.Fprintf(&e.b, "lost %s\n", fmtMsg(m))
			}
		}
	}
}

func (e *ienv) propose(t *testing.T, d *datadriven.TestData) {
	var id, client, req uint64
	d.ScanArgs(t, "id", &id)
	d.MaybeScanArgs(t, "client", &client)
	d.MaybeScanArgs(t, "req", &req)
	ack := AckApplied
	if a, ok := d.Arg("ack"); ok {
		switch a.SingleVal(t) {
		case "replicated":
			ack = AckReplicated
		case "appended":
			ack = AckAppended
		default:
			d.Fatalf(t, "ack=replicated|appended")
		}
	}
	err := e.n.rs[id].ProposeAck(e.n.now, Request{Client: client, ReqNum: req, Data: []byte(words(d))}, ack)
	e.result(err)
}

func (e *ienv) nilext(t *testing.T, d *datadriven.TestData) {
	var client, req uint64
	var key string
	d.ScanArgs(t, "client", &client)
	d.ScanArgs(t, "req", &req)
	d.ScanArgs(t, "key", &key)
	q := NilextRequest{Request: Request{Client: client, ReqNum: req, Data: []byte(words(d, "sync"))},
		Keys: [][]byte{[]byte(key)}, Sync: d.HasArg("sync")}
	to := e.up()
	if a, ok := d.Arg("to"); ok {
		to = nil
		for _, v := range a.Vals {
			to = append(to, e.parseID(d, v))
		}
	}
	for _, id := range to {
		fmt.Fprintf(&e.b, "%d: ", id)
		e.result(e.n.rs[id].Nilext(e.n.now, q))
	}
}

func (e *ienv) read(t *testing.T, d *datadriven.TestData) {
	var id, op uint64
	var level, key string
	d.ScanArgs(t, "id", &id)
	d.ScanArgs(t, "level", &level)
	d.MaybeScanArgs(t, "op", &op)
	d.MaybeScanArgs(t, "key", &key)
	r := e.n.rs[id]
	now := e.n.now
	switch level {
	case "linearizable", "lease":
		// The drivers' rule (simnode_test.go onClientRead): under the lease
		// at once, else a read-index round.
		idx, err := r.LeaseRead(now)
		if err == nil {
			fmt.Fprintf(&e.b, "lease read: serve once applied >= %d\n", idx)
			return
		}
		fmt.Fprintf(&e.b, "lease read: %v\n", err)
		if level == "lease" || !errors.Is(err, ErrNoLease) {
			return
		}
		fallthrough
	case "index":
		e.ctx++
		fmt.Fprintf(&e.b, "read-index ctx=%d: ", e.ctx)
		e.result(r.ReadIndex(now, e.ctx))
	case "durable":
		e.ctx++
		fmt.Fprintf(&e.b, "durability wait ctx=%d for op %d: ", e.ctx, op)
		e.result(r.WaitReadable(now, e.ctx, op))
	case "follower":
		R, err := r.FollowerRead(now)
		if err != nil {
			fmt.Fprintf(&e.b, "follower read: %v\n", err)
			return
		}
		fmt.Fprintf(&e.b, "follower read: serve a key whose version <= %d (applied %d)\n", R, r.applied)
	case "nilext":
		e.ctx++
		slow, err := r.ReadNilext(now, e.ctx, [][]byte{[]byte(key)})
		switch {
		case err != nil:
			fmt.Fprintf(&e.b, "nilext read: %v\n", err)
		case slow:
			fmt.Fprintf(&e.b, "nilext read ctx=%d: %s has pending updates: ordered, wait for their commit\n", e.ctx, key)
		default:
			fmt.Fprintf(&e.b, "nilext read: %s has no pending update: serve as usual\n", key)
		}
	default:
		d.Fatalf(t, "unknown read level %q", level)
	}
}

func (e *ienv) result(err error) {
	if err != nil {
		fmt.Fprintf(&e.b, "error: %v\n", err)
	} else {
		fmt.Fprintf(&e.b, "ok\n")
	}
}

func (e *ienv) status(id uint64) {
	r := e.n.rs[id]
	if r == nil {
		fmt.Fprintf(&e.b, "%d: down\n", id)
		return
	}
	i := r.Info()
	role := "follower"
	if i.IsLeader {
		role = "leader"
	}
	fmt.Fprintf(&e.b, "%d: %s %s v%d lnv%d leader=%d last=%d commit=%d applied=%d persisted=%d",
		id, i.Status, role, i.View, i.LastNormalView, i.Leader, i.LastOp, i.Commit, i.Applied, i.Persisted)
	if i.FirstOp > 1 {
		fmt.Fprintf(&e.b, " first=%d", i.FirstOp)
	}
	if i.IsLeader && (r.cfg.FollowerReads || r.cfg.Nilext) {
		fmt.Fprintf(&e.b, " acked=%d", i.Acked)
	}
	if r.cfg.FollowerReads || r.cfg.Nilext {
		fmt.Fprintf(&e.b, " readable=%d", i.Readable)
	}
	if r.cfg.Nilext {
		fmt.Fprintf(&e.b, " dlog=%d", i.DLogLen)
	}
	if i.Epoch != 1 || i.Joining || i.Leaving {
		fmt.Fprintf(&e.b, " epoch=%d members=%v", i.Epoch, r.cfg.Members)
	}
	switch {
	case i.Joining:
		fmt.Fprintf(&e.b, " joining")
	case i.Retired:
		fmt.Fprintf(&e.b, " retired")
	case i.Leaving:
		fmt.Fprintf(&e.b, " leaving")
	}
	fmt.Fprintln(&e.b)
}

// onReady prints one Ready in field order (the order the driver performs it).
func (e *ienv) onReady(id uint64, rd *Ready) {
	for _, a := range rd.NilextAcks {
		k := [2]uint64{a.Client, a.ReqNum}
		e.acks[k] = append(e.acks[k], a)
	}
	if !e.print {
		return
	}
	b := &e.b
	fmt.Fprintf(b, "> %d ready\n", id)
	if rd.PersistSeq != 0 {
		fmt.Fprintf(b, "  write seq=%d:", rd.PersistSeq)
		if s := rd.Snapshot; s != nil {
			fmt.Fprintf(b, " snapshot@%d(%q, %d clients)", s.Op, s.Data, len(s.Clients))
		}
		if rd.HasTruncate {
			fmt.Fprintf(b, " truncate>%d", rd.Truncate)
		}
		for _, en := range rd.Entries {
			fmt.Fprintf(b, " %s", fmtEntry(en))
		}
		for _, q := range rd.DLog {
			fmt.Fprintf(b, " dlog[c%d#%d %q]", q.Client, q.ReqNum, q.Data)
		}
		if ms := rd.Membership; ms != nil {
			fmt.Fprintf(b, " membership(e%d %v start%d prev%v)", ms.Epoch, ms.Members, ms.Start, ms.Previous)
		}
		if hs := rd.HardState; hs != nil {
			fmt.Fprintf(b, " hardstate(v%d lnv%d c%d)", hs.View, hs.LastNormalView, hs.Commit)
		}
		fmt.Fprintln(b)
	}
	for _, m := range rd.Messages {
		fmt.Fprintf(b, "  send %s\n", fmtMsg(m))
	}
	for _, c := range rd.Committed {
		if c.Duplicate {
			fmt.Fprintf(b, "  apply %s duplicate\n", fmtEntry(c.Entry))
		} else {
			fmt.Fprintf(b, "  apply %s -> r%d\n", fmtEntry(c.Entry), c.Op)
		}
	}
	for _, a := range rd.Acks {
		fmt.Fprintf(b, "  early-ack c%d#%d op%d\n", a.Client, a.ReqNum, a.Op)
	}
	for _, a := range rd.NilextAcks {
		fmt.Fprintf(b, "  nilext-ack c%d#%d from %d v%d leader=%t\n", a.Client, a.ReqNum, a.From, a.View, a.Leader)
	}
	for _, r := range rd.Replies {
		if r.Err != nil {
			fmt.Fprintf(b, "  reply c%d#%d error: %v\n", r.Client, r.ReqNum, r.Err)
		} else {
			fmt.Fprintf(b, "  reply c%d#%d op%d %q\n", r.Client, r.ReqNum, r.Op, r.Result)
		}
	}
	for _, rs := range rd.ReadStates {
		if rs.Err != nil {
			fmt.Fprintf(b, "  read ctx=%d error: %v\n", rs.Ctx, rs.Err)
		} else {
			fmt.Fprintf(b, "  read ctx=%d: serve once applied >= %d\n", rs.Ctx, rs.Index)
		}
	}
	for _, p := range rd.SnapshotNeeded {
		fmt.Fprintf(b, "  snapshot-needed %d\n", p)
	}
	for _, err := range rd.Errors {
		fmt.Fprintf(b, "  error %v\n", err)
	}
}

func fmtEntry(en Entry) string {
	if isReconfig(&en) {
		ms, _, _ := decodeMembership(en.Data)
		return fmt.Sprintf("%d/v%d(reconfig e%d %v)", en.Op, en.View, en.ReqNum, ms)
	}
	return fmt.Sprintf("%d/v%d(c%d#%d %q)", en.Op, en.View, en.Client, en.ReqNum, en.Data)
}

// fmtMsg is Message.String with what the scripts need to see besides: the
// entries a message carries, the CAD fields, a request
// to sync at once (SyncWanted, SyncAsked).
func fmtMsg(m Message) string {
	s := m.String()
	switch m.Type {
	case MsgPrepare:
		if m.Readable != 0 || m.Grant != 0 {
			s += fmt.Sprintf(" r%d g%d", m.Readable, m.Grant)
		}
	case MsgPrepareOK:
		if m.Persisted != m.Op {
			s += fmt.Sprintf(" (holds op%d in memory, op%d on disk)", m.Op, m.Persisted)
		}
	case MsgDoViewChange:
		if len(m.DLog) > 0 || m.DLogStale {
			s += fmt.Sprintf(" dlog=%d stale=%t", len(m.DLog), m.DLogStale)
		}
	}
	if SyncWanted(&m) || SyncAsked(&m) {
		s += " sync-now"
	}
	for _, en := range m.Entries {
		s += " " + fmtEntry(en)
	}
	return s
}
