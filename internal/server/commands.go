package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

func eq(b []byte, upper string) bool { return command.Eq(b, upper) }

func parseInt64(b []byte) (int64, error) { return command.ParseInt(b) }

// parseWriteInto turns a write command into a shard operation in *dst (the
// zero Op), copying its bytes into the arena (args alias the reader's
// buffer). The front door parses a pipelined write straight into its batch's
// slot (queueWrite): a kv.Op is ~200 bytes, and copying it up through three
// returns cost a pipelined SET a few per cent of its CPU. SET, the commonest,
// is parsed in place; the rest build their Op and store it once.
func parseWriteInto(dst *kv.Op, spec *command.Spec, args [][]byte, a *arena) (replyShape, error) {
	switch spec {
	case setSpec:
		return shapeAsIs, parseSet(dst, args, a) // expiry.go
	case hsetSpec:
		// A one-field HSET, the commonest hash write, copies its three
		// arguments here: parseHSetInto's and copyKeyArgs's calls and
		// checks were ~50 instructions of a pipelined HSET
		// (docs/design/hashes.md, "Session 35").
		if len(args) == 4 {
			if k, f, v := args[1], args[2], args[3]; len(k)+len(f)+len(v) <= 64<<10 {
				dst.Kind = kv.KindHSet
				dst.Key, dst.Keys = a.copyKeyFieldValue(k, f, v)
				return shapeAsIs, nil
			}
		}
		return shapeAsIs, parseHSetInto(dst, "HSET", args, a) // hash.go
	}
	op, shape, err := parseWriteOther(spec, args, a)
	*dst = op
	return shape, err
}

// parseWriteOther is parseWriteInto's parser of every write but SET.
func parseWriteOther(spec *command.Spec, args [][]byte, a *arena) (kv.Op, replyShape, error) {
	var op kv.Op
	shape := shapeAsIs
	switch spec.Name {
	case "SETNX":
		op = kv.Op{Kind: kv.KindSet, Key: a.copy(args[1]), Value: a.copy(args[2]), Cond: kv.IfAbsent}
		shape = shapeSetNX
	case "MSET":
		if len(args)%2 != 1 {
			return op, 0, errf("ERR wrong number of arguments for 'mset' command")
		}
		op = kv.Op{Kind: kv.KindMSet, Keys: a.copyArgs(args[1:])}
	case "DEL", "UNLINK":
		op = kv.Op{Kind: kv.KindDel, Keys: a.copyArgs(args[1:])}
	case "INCR", "DECR", "INCRBY", "DECRBY":
		op = kv.Op{Kind: kv.KindIncrBy, Key: a.copy(args[1]), Delta: 1}
		if len(args) == 3 {
			n, err := parseInt64(args[2])
			if err != nil {
				return op, 0, err
			}
			op.Delta = n
		}
		if spec.Name[0] == 'D' {
			if op.Delta == -op.Delta && op.Delta != 0 { // MinInt64 cannot be negated
				return op, 0, errf("ERR decrement would overflow")
			}
			op.Delta = -op.Delta
		}
	case "GETSET":
		op = kv.Op{Kind: kv.KindGetSet, Key: a.copy(args[1]), Value: a.copy(args[2])}
	case "APPEND":
		op = kv.Op{Kind: kv.KindAppend, Key: a.copy(args[1]), Value: a.copy(args[2])}
	case "KEFIR.CAS":
		op = kv.Op{Kind: kv.KindCAS, Key: a.copy(args[1]), Expected: a.copy(args[2]), Value: a.copy(args[3])}
	default:
		if op, ok, err := parseExpiryWrite(spec, args, a); ok { // expiry.go
			return op, shape, err
		}
		op, handled, err := parseMoreWrite(spec, args, a) // keyspace.go
		if !handled {
			return op, 0, errf("ERR %s is not a write", strings.ToLower(spec.Name))
		}
		return op, shapeAsIs, err
	}
	return op, shape, nil
}

// parseRead turns a read command into a shard operation. Reads execute before the
// next command is parsed, so their arguments need no copy.
func parseRead(spec *command.Spec, args [][]byte) (kv.Op, error) {
	switch spec.Name {
	case "GET":
		return kv.Op{Kind: kv.KindGet, Key: args[1]}, nil
	case "STRLEN":
		return kv.Op{Kind: kv.KindStrlen, Key: args[1]}, nil
	case "MGET":
		return kv.Op{Kind: kv.KindMGet, Keys: args[1:]}, nil
	case "EXISTS":
		return kv.Op{Kind: kv.KindExists, Keys: args[1:]}, nil
	case "KEFIR.WATCH":
		return kv.Op{Kind: kv.KindWatch, Keys: args[1:]}, nil // tx.go
	case "KEFIR.EXECRO":
		return parseExec(args, nil) // tx.go
	case "KEFIR.SCAN":
		op := kv.Op{Kind: kv.KindScan, Key: args[1]}
		if len(args[2]) > 0 {
			op.End = args[2]
		}
		switch {
		case len(args) == 3:
		case len(args) == 5 && eq(args[3], "LIMIT"):
			n, err := parseInt64(args[4])
			if err != nil || n <= 0 {
				return op, errf("ERR LIMIT must be a positive integer")
			}
			if n > shard.DefaultMaxScan {
				n = shard.DefaultMaxScan
			}
			op.Limit = int(n)
		default:
			return op, errSyntax
		}
		return op, nil
	}
	if op, ok := parseExpiryRead(spec, args); ok { // expiry.go
		return op, nil
	}
	return kv.Op{}, errf("ERR %s is not a read", strings.ToLower(spec.Name))
}

// admin runs a connection or node command; a nil error means the reply was written.
func (c *conn) admin(spec *command.Spec, args [][]byte) error {
	w := c.w
	switch spec.Name {
	case "PING":
		switch len(args) {
		case 1:
			return w.WriteSimple("PONG")
		case 2:
			return w.WriteBulk(args[1])
		}
		return errf("ERR wrong number of arguments for 'ping' command")
	case "ECHO":
		return w.WriteBulk(args[1])
	case "QUIT":
		c.closing = true
		return w.WriteSimple("OK")
	case "SELECT":
		if string(args[1]) != "0" {
			return errf("ERR DB index is out of range (Kefir has only database 0)")
		}
		return w.WriteSimple("OK")
	case "AUTH":
		return c.auth(args[1:])
	case "HELLO":
		return c.hello(args[1:])
	case "CLIENT":
		return c.client(args[1:])
	case "COMMAND":
		return c.commandCmd(args[1:])
	case "CONFIG":
		return c.config(args[1:])
	case "INFO":
		section := ""
		if len(args) > 1 {
			section = strings.ToLower(string(args[1]))
		}
		return w.WriteBulkString(c.srv.info(section))
	case "DBSIZE":
		n, err := c.srv.dbSize(context.Background())
		if err != nil {
			return err
		}
		return w.WriteInt(n)
	case "KEFIR.CONSISTENCY":
		if len(args) == 1 {
			return w.WriteBulkString(c.cons.String())
		}
		if len(args) != 2 {
			return errSyntax
		}
		l, err := level.ParseConsistency(string(args[1]))
		if err != nil {
			return err
		}
		if err := c.srv.shard.CheckConsistency(l); unsupported(err) {
			return errf("ERR level %s not supported by this deployment", l)
		}
		c.cons = l
		return w.WriteSimple("OK")
	case "KEFIR.DURABILITY":
		if len(args) == 1 {
			return w.WriteBulkString(c.dur.String())
		}
		if len(args) != 2 {
			return errSyntax
		}
		d, err := level.ParseDurability(string(args[1]))
		if err != nil {
			return err
		}
		if err := c.srv.shard.CheckDurability(d); unsupported(err) {
			return errf("ERR level %s not supported by this deployment", d)
		}
		c.dur = d
		return w.WriteSimple("OK")
	case "KEFIR.SESSION":
		if len(args) == 1 {
			return w.WriteBulkString(c.sess.String())
		}
		if len(args) != 2 {
			return errSyntax
		}
		s, err := shard.ParseSession(string(args[1]))
		if err != nil {
			return errf("ERR invalid session token")
		}
		c.sess = s
		return w.WriteSimple("OK")
	case "MULTI":
		if c.multi {
			return errf("ERR MULTI calls can not be nested")
		}
		c.multi = true
		// OK, as Redis answers: clients pipeline MULTI, their commands and
		// EXEC and read an error reply to MULTI as a broken connection
		// (go-redis stops reading there and leaves the rest unread).
		return w.WriteSimple("OK")
	case "DISCARD":
		if !c.multi {
			return errf("ERR DISCARD without MULTI")
		}
		c.resetTx() // tx.go: the queue and the watches
		return w.WriteSimple("OK")
	case "UNWATCH":
		c.tx.watches = nil
		return w.WriteSimple("OK")
	case "KEFIR.CALL":
		return c.call(args)
	case "KEFIR.TOPOLOGY":
		return c.topology()
	case "CLUSTER", "ASKING", "READONLY", "READWRITE":
		return c.clusterCmd(spec, args) // cluster.go
	case "KEFIR.SLOTS":
		return c.slotsCmd(args) // slots.go
	case "KEFIR.GROUP":
		return c.groupCmd(args) // membership.go
	case "KEFIR.NILEXT":
		return c.nilextTake(args)
	case "KEFIR.CHAINVERSION":
		return c.chainVersion(args) // chainversion.go
	case "SCRIPT":
		return c.scriptCmd(args) // script.go
	case "KEFIR.TX":
		return c.txCmd(args) // itx.go
	}
	return errf("ERR %s is not implemented", strings.ToLower(spec.Name))
}

// unsupported reports whether a level check failed because the deployment
// cannot serve the level at all; a replica that cannot serve it right now
// (a follower, a view change) routes each request instead.
func unsupported(err error) bool {
	return err != nil && !errors.Is(err, shard.ErrUnavailable)
}

// call runs KEFIR.CALL [CONSISTENCY l] [DURABILITY l] [SESSION t] [REQID c s] CMD ...
func (c *conn) call(args [][]byte) error {
	var o callOpts
	o.wrapped = true
	seen := map[string]bool{}
	i := 1
	for ; i < len(args); i++ {
		opt := strings.ToUpper(string(args[i]))
		if opt == "CMD" {
			break
		}
		if seen[opt] {
			return errf("ERR KEFIR.CALL option %s given twice", opt)
		}
		seen[opt] = true
		need := 1
		switch opt {
		case "REQID":
			need = 2
		case "REDIRECT":
			need = 0
		}
		if i+need >= len(args) {
			return errSyntax
		}
		v := string(args[i+1])
		switch opt {
		case "REDIRECT":
			o.redirect = true
		case "CONSISTENCY":
			l, err := level.ParseConsistency(v)
			if err != nil {
				return err
			}
			if err := c.srv.shard.CheckConsistency(l); unsupported(err) {
				return errf("ERR level %s not supported by this deployment", l)
			}
			o.cons = l
		case "DURABILITY":
			d, err := level.ParseDurability(v)
			if err != nil {
				return err
			}
			if err := c.srv.shard.CheckDurability(d); unsupported(err) {
				return errf("ERR level %s not supported by this deployment", d)
			}
			o.dur = d
		case "SESSION":
			s, err := shard.ParseSession(v)
			if err != nil {
				return errf("ERR invalid session token")
			}
			o.session, o.sess = true, s
		case "REQID":
			id, err1 := strconv.ParseUint(v, 10, 64)
			seq, err2 := strconv.ParseUint(string(args[i+2]), 10, 64)
			if err1 != nil || err2 != nil || id == 0 {
				return errf("ERR REQID needs a non-zero client id and a sequence number")
			}
			o.id = shard.ReqID{Client: id, Seq: seq}
		default:
			return errf("ERR unknown KEFIR.CALL option '%s'", clip(args[i]))
		}
		i += need
	}
	if i+1 >= len(args) {
		return errf("ERR KEFIR.CALL needs CMD <command> [args...]")
	}
	inner := args[i+1:]
	spec, ok := command.Lookup(inner[0])
	if !ok {
		return unknownCommand(inner)
	}
	if spec.Has(command.Wrapper) {
		return errf("ERR KEFIR.CALL cannot be nested")
	}
	if err := c.check(spec, inner); err != nil {
		return err
	}
	// Count the inner command too, so per-command metrics see wrapped traffic.
	c.timed = append(c.timed, timedCmd{cmd: spec.ID})
	if spec.Class == command.Admin {
		c.flushWrites()
		if !c.keyspaceBarrier(spec, inner) {
			return nil // the wait failed: the batch gets no replies, the connection closes
		}
		if o.session {
			_ = c.w.WriteArrayHeader(2)
			_ = c.w.WriteBulkString(o.sess.String())
		}
		c.callRedirect = o.redirect // a forwarded CLUSTER COUNTKEYSINSLOT redirects (cluster.go)
		err := c.admin(spec, inner)
		c.callRedirect = false
		if err != nil {
			c.timed[len(c.timed)-1].err = true
			c.writeErr(err)
		}
		return nil
	}
	c.run(spec, inner, o)
	return nil
}

// auth runs AUTH [user] password.
func (c *conn) auth(args [][]byte) error {
	if err := c.checkAuth(args); err != nil {
		return err
	}
	return c.w.WriteSimple("OK")
}

// authMaxConnFails is how many failed AUTH attempts one connection gets
// before it is closed.
const authMaxConnFails = 10

// checkAuth checks [user] password and authenticates the connection. Failures are
// rate-limited per remote host, for the connections that failed, and logged
// without the attempted secret.
func (c *conn) checkAuth(args [][]byte) error {
	if len(args) > 2 {
		return errSyntax
	}
	if c.srv.cfg.Password == "" {
		// Like Redis's passwordless default user: the two-argument form (which
		// HELLO ... AUTH uses) succeeds, the legacy one-argument form is an error.
		if len(args) == 2 {
			return nil
		}
		return errf("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
	}
	pwd := args[len(args)-1]
	user := "default"
	if len(args) == 2 {
		user = string(args[0])
	}
	// The host's penalty holds back the connections that failed: the
	// guesser's. A connection that has not failed yet is always heard, so a
	// user who mistyped (in this or another process on the same host) gets
	// in at once with the right password; a guesser gets one guess per
	// connection while the host is penalized, and authMaxConnFails per
	// connection in all.
	if c.authFails > 0 && !c.srv.limiter.allow(c.addr) {
		c.log.Warn("AUTH refused: too many failures from this host on this connection")
		return errf("ERR too many failed AUTH attempts; try again later, or on a new connection")
	}
	ok := user == "default" && subtle.ConstantTimeCompare(pwd, []byte(c.srv.cfg.Password)) == 1
	if !ok {
		c.authFails++
		if c.authFails >= authMaxConnFails {
			c.closing = true // the error is the connection's last reply
		}
		c.srv.limiter.fail(c.addr)
		c.srv.m.authFails.Inc()
		// The only user is "default": any other name is logged as such, never
		// spelled out, since a password typed into the user slot (AUTH pass
		// pass, HELLO 3 AUTH pass x) would otherwise reach the log.
		logUser := "default"
		if user != "default" {
			logUser = "(not a user)"
		}
		c.log.Warn("AUTH failed", "user", logUser)
		return errWrongPwd
	}
	c.srv.limiter.succeed(c.addr)
	c.authFails = 0
	c.authed = true
	return nil
}

// hello implements HELLO [protover [AUTH user pass] [SETNAME name]].
func (c *conn) hello(args [][]byte) error {
	proto := c.w.Protocol()
	if len(args) > 0 {
		n, err := parseInt64(args[0])
		if err != nil {
			return errf("ERR Protocol version is not an integer or out of range")
		}
		if n != 2 && n != 3 {
			return errf("NOPROTO unsupported protocol version")
		}
		proto = int(n)
		args = args[1:]
	}
	for len(args) > 0 {
		switch {
		case eq(args[0], "AUTH") && len(args) >= 3:
			if err := c.checkAuth(args[1:3]); err != nil {
				return err
			}
			args = args[3:]
		case eq(args[0], "SETNAME") && len(args) >= 2:
			c.name = string(args[1])
			args = args[2:]
		default:
			return errSyntax
		}
	}
	if !c.authed {
		return errNoAuth
	}
	c.w.SetProtocol(proto)
	w := c.w
	_ = w.WriteMapHeader(7)
	_ = w.WriteBulkString("server")
	_ = w.WriteBulkString("kefir")
	_ = w.WriteBulkString("version")
	_ = w.WriteBulkString(Version)
	_ = w.WriteBulkString("proto")
	_ = w.WriteInt(int64(proto))
	_ = w.WriteBulkString("id")
	_ = w.WriteInt(c.id)
	_ = w.WriteBulkString("mode")
	_ = w.WriteBulkString("standalone")
	_ = w.WriteBulkString("role")
	_ = w.WriteBulkString(c.srv.redisRole())
	_ = w.WriteBulkString("modules")
	return w.WriteArrayHeader(0)
}

func (c *conn) client(args [][]byte) error {
	switch {
	case eq(args[0], "ID") && len(args) == 1:
		return c.w.WriteInt(c.id)
	case eq(args[0], "SETNAME") && len(args) == 2:
		if bytes.ContainsAny(args[1], " \n\r") {
			return errf("ERR Client names cannot contain spaces, newlines or special characters.")
		}
		c.name = string(args[1])
		return c.w.WriteSimple("OK")
	case eq(args[0], "GETNAME") && len(args) == 1:
		if c.name == "" {
			return c.w.WriteNull()
		}
		return c.w.WriteBulkString(c.name)
	case eq(args[0], "INFO") && len(args) == 1:
		return c.w.WriteBulkString(fmt.Sprintf("id=%d addr=%s name=%s resp=%d\n", c.id, c.addr, c.name, c.w.Protocol()))
	case eq(args[0], "SETINFO"):
		// Sent by recent client libraries on connect; nothing to keep.
		return c.w.WriteSimple("OK")
	}
	return errf("ERR unknown subcommand '%s' for 'client'. Try CLIENT ID, SETNAME, GETNAME or INFO.", clip(args[0]))
}

// commandCmd answers COMMAND, COMMAND COUNT, COMMAND INFO and COMMAND DOCS with
// what redis-cli and client libraries need (DOCS is empty: hints are optional).
func (c *conn) commandCmd(args [][]byte) error {
	w := c.w
	all := command.All()
	if len(args) == 0 {
		_ = w.WriteArrayHeader(len(all))
		for _, s := range all {
			c.commandInfo(s)
		}
		return nil
	}
	switch {
	case eq(args[0], "COUNT"):
		return w.WriteInt(int64(len(all)))
	case eq(args[0], "DOCS"):
		return w.WriteMapHeader(0)
	case eq(args[0], "INFO"):
		_ = w.WriteArrayHeader(len(args) - 1)
		for _, n := range args[1:] {
			if s, ok := command.Lookup(n); ok {
				c.commandInfo(s)
			} else {
				_ = w.WriteNullArray()
			}
		}
		return nil
	}
	return errf("ERR unknown subcommand '%s' for 'command'", clip(args[0]))
}

func (c *conn) commandInfo(s *command.Spec) {
	w := c.w
	_ = w.WriteArrayHeader(6)
	_ = w.WriteBulkString(strings.ToLower(s.Name))
	_ = w.WriteInt(int64(s.Arity))
	var flags []string
	if s.IsUpdate() {
		flags = append(flags, "write")
	} else if s.Class == command.Read {
		flags = append(flags, "readonly")
	}
	if s.Has(command.Fast) {
		flags = append(flags, "fast")
	}
	if s.Has(command.NoAuth) {
		flags = append(flags, "no-auth")
	}
	_ = w.WriteSetHeader(len(flags))
	for _, f := range flags {
		_ = w.WriteSimple(f)
	}
	_ = w.WriteInt(int64(s.FirstKey))
	_ = w.WriteInt(int64(s.LastKey))
	_ = w.WriteInt(int64(s.KeyStep))
}

// config answers CONFIG GET for the settings tools probe (redis-benchmark asks for
// "save" and "appendonly"); everything else is an empty answer, CONFIG SET refused.
func (c *conn) config(args [][]byte) error {
	if !eq(args[0], "GET") || len(args) != 2 {
		return errf("ERR CONFIG supports only GET; Kefir is configured by flags, environment or file")
	}
	vals := map[string]string{
		"save":       "",
		"appendonly": "yes",
		"appendfsync": map[level.Durability]string{
			level.Sync: "always", level.CAD: "everysec", level.Async: "no"}[c.srv.cfg.Durability],
		"databases":  "1",
		"maxclients": strconv.Itoa(c.srv.cfg.MaxClients),
	}
	key := strings.ToLower(string(args[1]))
	v, ok := vals[key]
	if key == "*" {
		_ = c.w.WriteMapHeader(len(vals))
		for k, v := range vals {
			_ = c.w.WriteBulkString(k)
			_ = c.w.WriteBulkString(v)
		}
		return nil
	}
	if !ok {
		return c.w.WriteMapHeader(0)
	}
	_ = c.w.WriteMapHeader(1)
	_ = c.w.WriteBulkString(key)
	return c.w.WriteBulkString(v)
}

// userKeys counts the keys a read finds: the engine's live keys (a deleted key
// stops counting at its deletion, not at compaction) minus the live rows the
// shard keeps for itself under kv.ReservedPrefix (client table, version
// reservations, holes), which no read shows. DBSIZE and INFO keyspace report
// it; like Redis's, it counts what this node has applied.
func (s *Server) userKeys() int64 {
	var n int64
	for _, db := range s.engines() { // at a node of several groups every hosted group's
		n += engineUserKeys(db)
	}
	return n
}

// engineUserKeys is one engine's live keys less its reserved rows.
func engineUserKeys(db *storage.DB) int64 {
	return max(int64(db.Stats().LiveKeys)-int64(db.CountLive(kv.ReservedPrefix, reservedEnd)), 0)
}

// dbSize is DBSIZE: the node's user keys (userKeys) and, at a node of
// several groups, those of every group it does not host, asked of a member
// of each (KEFIR.GROUPSCAN g COUNT): any node answers for the whole
// keyspace, as its keyspace scans do (docs/cluster.md).
func (s *Server) dbSize(ctx context.Context) (int64, error) {
	n := s.userKeys()
	if s.multi == nil {
		return n, nil
	}
	for _, g := range s.multi.Slots().Groups {
		if _, ok := s.multi.Engine(g.ID); ok {
			continue
		}
		k, err := s.groupKeys(ctx, g.ID)
		if err != nil {
			return 0, fmt.Errorf("DBSIZE: %w", err)
		}
		n += k
	}
	return n, nil
}

// groupKeys asks a node of group id for its replica's key count, again
// (of the node the map names by then, backing off) for up to 5 s while no
// node of it is known or the one asked does not answer: a view change or
// a node's crash delays DBSIZE rather than failing it.
func (s *Server) groupKeys(ctx context.Context, id cluster.GroupID) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pause := 20 * time.Millisecond
	for {
		var err error
		if _, addr, _ := s.multi.Leader(id); addr == "" {
			err = fmt.Errorf("%w: no node of group %d is known", cluster.ErrNoLeader, id)
		} else {
			var k int64
			if k, err = s.router.AskGroupKeys(ctx, addr, id); err == nil {
				return k, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(pause):
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// engines are the node's engines: its one, or at a node of several groups
// (Config.Groups) every hosted group's.
func (s *Server) engines() []*storage.DB {
	if s.multi != nil {
		return s.multi.Engines()
	}
	return []*storage.DB{s.db}
}

// expiresInfo is INFO keyspace's expires= (keys stored with an expiry, over
// every engine of the node) and avg_ttl= (milliseconds, an estimate from a
// sample of those keys, shard.SampleTTL, each engine's sample starting at a
// random key so that repeated INFOs look at different parts of the
// keyspace; 0 when no key has a TTL left, as Redis reports it).
func (s *Server) expiresInfo() (expires int, avgTTL int64) {
	now := expiryNow()
	var sum int64
	var n int
	for _, db := range s.engines() {
		expires += db.Stats().MetaKeys
		var from [8]byte
		binary.BigEndian.PutUint64(from[:], rand.Uint64())
		if sm, k, err := shard.SampleTTL(db, from[:], now); err == nil {
			sum, n = sum+sm, n+k
		}
	}
	if n > 0 {
		avgTTL = sum / int64(n)
	}
	return expires, avgTTL
}

// reservedEnd is the first key after every key starting with kv.ReservedPrefix.
var reservedEnd = func() []byte {
	e := append([]byte(nil), kv.ReservedPrefix...)
	e[len(e)-1]++ // the prefix ends in '/', not 0xff
	return e
}()

// infoWants reports whether INFO section (lower case) shows section name.
func infoWants(section, name string) bool {
	return section == "" || section == "all" || section == "everything" || section == "default" || section == name
}

// info renders INFO in Redis's "# Section\r\nkey:value" format.
func (s *Server) info(section string) string {
	var b strings.Builder
	want := func(name string) bool { return infoWants(section, name) }
	st := s.shard.Status()
	if want("server") {
		fmt.Fprintf(&b, "# Server\r\nkefir_version:%s\r\nredis_version:7.0.0\r\nnode_id:%s\r\nprocess_id:%d\r\ntcp_port:%s\r\nuptime_in_seconds:%d\r\ngo_version:%s\r\narch_bits:64\r\n\r\n",
			Version, s.cfg.NodeID, pid, portOf(s.ClientAddr()), int(time.Since(s.started).Seconds()), runtime.Version())
	}
	if want("clients") {
		fmt.Fprintf(&b, "# Clients\r\nconnected_clients:%d\r\nmaxclients:%d\r\n\r\n", s.m.connected.Load(), s.cfg.MaxClients)
	}
	if want("stats") {
		fmt.Fprintf(&b, "# Stats\r\ntotal_connections_received:%d\r\ntotal_commands_processed:%d\r\nexpired_keys:%d\r\n\r\n",
			s.m.total.Load(), s.m.commands.Load(), s.expiredKeys())
	}
	if want("keyspace") {
		// expires: keys stored with an expiry (expiry.go), the expired ones
		// active expiry has not deleted yet included, as Redis counts them.
		expires, avg := s.expiresInfo()
		fmt.Fprintf(&b, "# Keyspace\r\ndb0:keys=%d,expires=%d,avg_ttl=%d\r\n\r\n", s.userKeys(), expires, avg)
	}
	if want("kefir") {
		fmt.Fprintf(&b, "# Kefir\r\nrole:%s\r\ndefault_consistency:%s\r\ndefault_durability:%s\r\nlast_version:%d\r\nlog_pos:%d\r\ndurable_pos:%d\r\nwrites:%d\r\nsyncs:%d\r\nread_syncs:%d\r\ndeduplicated_writes:%d\r\nclient_table_entries:%d\r\n\r\n",
			s.roleName(), s.cfg.Consistency, s.cfg.Durability, st.LastVersion, st.LastPos, st.DurablePos, st.Writes, st.Syncs, st.ReadSyncs, st.Deduped, st.Clients)
	}
	if want("cluster") {
		on := 0
		if s.clusterOn {
			on = 1 // redis-py's RedisCluster checks it before CLUSTER SLOTS
		}
		fmt.Fprintf(&b, "# Cluster\r\ncluster_enabled:%d\r\n\r\n", on)
	}
	if ri := s.replicaInfo(); ri != nil && want("replication") {
		fmt.Fprintf(&b, "# Replication\r\nrole:%s\r\nreplica_id:%d\r\ncluster_id:%d\r\nvr_status:%s\r\nview:%d\r\nleader_id:%d\r\ncommit_op:%d\r\napplied_op:%d\r\nlog_fsyncs:%d\r\nforwarded:%d\r\nfailed:%s\r\n\r\n",
			ri.Role, ri.ReplicaID, ri.ClusterID, ri.Status, ri.View, ri.Leader, ri.Commit, ri.Applied, ri.Fsyncs, ri.Forwarded, ri.Failed)
	}
	return b.String()
}
