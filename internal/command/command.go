// Package command is Kefir's one command table: for every command the RESP front door
// accepts, its arity, its class (read, nilext update, non-nilext update, admin) and its
// flags. The front door validates arity with it, COMMAND answers from it, metrics are
// indexed by it, and the replication layer routes by its class — so a command's class is
// decided here and nowhere else (ARCHITECTURE §2).
//
// It must not import any other Kefir package except internal/level; in particular not the
// server, the shard or the storage engine, which all depend on it.
package command

import (
	"bytes"
	"sort"
	"strings"
)

// Class is how the replication layer must treat a command (ARCHITECTURE §2).
type Class uint8

const (
	// Admin commands touch only the connection or the node (PING, HELLO, INFO, AUTH):
	// they never reach a shard.
	Admin Class = iota + 1
	// Read commands observe state and are served per consistency level.
	Read
	// NilextUpdate commands modify state and return no state-dependent result (plain SET,
	// MSET), so they may complete before they are ordered (Skyros fast path).
	NilextUpdate
	// NonNilextUpdate commands modify state and return something that depends on it
	// (INCR, SET NX, DEL's count): they must be ordered before they reply.
	NonNilextUpdate
)

// String names the class as the docs do.
func (c Class) String() string {
	switch c {
	case Admin:
		return "admin"
	case Read:
		return "read"
	case NilextUpdate:
		return "nilext-update"
	case NonNilextUpdate:
		return "non-nilext-update"
	}
	return "class(?)"
}

// IsUpdate reports whether the class modifies shard state.
func (c Class) IsUpdate() bool { return c == NilextUpdate || c == NonNilextUpdate }

// Flag is a property of a command beyond its class.
type Flag uint16

const (
	// NoAuth commands are allowed before the connection has authenticated.
	NoAuth Flag = 1 << iota
	// MultiKey commands touch several keys (routing must split or reject them).
	MultiKey
	// Fast commands run in constant time.
	Fast
	// Unsupported commands are known (so COMMAND lists them and the error is clear)
	// but not implemented in this deployment.
	Unsupported
	// DependsOnArgs marks commands whose class is decided by their arguments
	// (SET with NX/XX/GET is non-nilext); use Classify, not Spec.Class.
	DependsOnArgs
	// Wrapper commands carry another command (KEFIR.CALL).
	Wrapper
)

// Spec describes one command.
type Spec struct {
	// Name is the canonical upper-case name.
	Name string
	// Arity counts the command name, Redis style: n > 0 means exactly n words,
	// n < 0 means at least -n words.
	Arity int
	// Class is the command's class for its base form (see Classify).
	Class Class
	Flags Flag
	// FirstKey, LastKey and KeyStep locate keys in the argument vector for COMMAND
	// (Redis convention: LastKey -1 means the last argument).
	FirstKey, LastKey, KeyStep int
	// Summary is a one-line description for COMMAND DOCS and --help.
	Summary string
	// ID is the command's dense index in All(); metrics and counters use it.
	ID int
}

// Has reports whether the spec has flag f.
func (s *Spec) Has(f Flag) bool { return s.Flags&f != 0 }

// ArityOK reports whether a command of n words (name included) satisfies the arity.
func (s *Spec) ArityOK(n int) bool {
	if s.Arity >= 0 {
		return n == s.Arity
	}
	return n >= -s.Arity
}

// IsUpdate reports whether the command's base form modifies state.
func (s *Spec) IsUpdate() bool { return s.Class.IsUpdate() }

var table = []Spec{
	// Reads.
	{Name: "GET", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "value of a key"},
	{Name: "MGET", Arity: -2, Class: Read, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "values of several keys"},
	{Name: "EXISTS", Arity: -2, Class: Read, Flags: MultiKey | Fast, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "count of the given keys that exist"},
	{Name: "STRLEN", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "length of a key's value"},
	{Name: "KEFIR.SCAN", Arity: -3, Class: Read, Flags: MultiKey, FirstKey: 0, LastKey: 0, KeyStep: 0, Summary: "ordered range read: KEFIR.SCAN start end [LIMIT n]"},
	{Name: "KEFIR.GROUPSCAN", Arity: -3, Class: Read, Summary: "internal (nodes of several groups): one group's part of a keyspace scan, or its key count, for a node that cannot serve it: KEFIR.GROUPSCAN group start end limit | KEFIR.GROUPSCAN group COUNT"},

	// Updates. SET is nilext in its plain form; Classify looks at its options.
	{Name: "SET", Arity: -3, Class: NilextUpdate, Flags: DependsOnArgs, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a key: SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]"},
	{Name: "MSET", Arity: -3, Class: NilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 2, Summary: "set several keys"},
	// DEL answers how many keys it removed, which depends on state: non-nilext.
	{Name: "DEL", Arity: -2, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "delete keys, answering how many existed"},
	{Name: "UNLINK", Arity: -2, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "same as DEL"},
	{Name: "INCR", Arity: 2, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "add 1 to an integer value"},
	{Name: "DECR", Arity: 2, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "subtract 1 from an integer value"},
	{Name: "INCRBY", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "add n to an integer value"},
	{Name: "DECRBY", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "subtract n from an integer value"},
	{Name: "GETSET", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a key, answering its old value"},
	{Name: "APPEND", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "append to a value, answering the new length"},
	{Name: "SETNX", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a key only if it does not exist"},
	{Name: "KEFIR.CAS", Arity: 4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "compare and swap: KEFIR.CAS key expected new"},
	{Name: "KEFIR.CALL", Arity: -3, Class: Admin, Flags: Wrapper | DependsOnArgs, Summary: "run a command with per-call options (see docs/design/resp-extensions.md)"},

	// Connection and node.
	// PING needs AUTH on a protected node, as in Redis (NOAUTH): health checks
	// that must work without the password use HTTP /healthz.
	{Name: "PING", Arity: -1, Class: Admin, Flags: Fast, Summary: "liveness check"},
	{Name: "ECHO", Arity: 2, Class: Admin, Flags: Fast, Summary: "echo the argument"},
	{Name: "HELLO", Arity: -1, Class: Admin, Flags: Fast | NoAuth, Summary: "switch protocol (2 or 3) and authenticate"},
	{Name: "AUTH", Arity: -2, Class: Admin, Flags: Fast | NoAuth, Summary: "authenticate the connection"},
	{Name: "SELECT", Arity: 2, Class: Admin, Flags: Fast, Summary: "select database (only 0 exists)"},
	{Name: "QUIT", Arity: -1, Class: Admin, Flags: Fast | NoAuth, Summary: "close the connection"},
	{Name: "INFO", Arity: -1, Class: Admin, Summary: "node information"},
	{Name: "CLIENT", Arity: -2, Class: Admin, Summary: "CLIENT ID | SETNAME name | GETNAME | INFO"},
	{Name: "COMMAND", Arity: -1, Class: Admin, Summary: "describe commands"},
	{Name: "CONFIG", Arity: -2, Class: Admin, Summary: "CONFIG GET answers the few settings tools ask for"},
	{Name: "DBSIZE", Arity: 1, Class: Admin, Summary: "number of keys this node has applied (deleted keys not counted)"},
	{Name: "KEFIR.CONSISTENCY", Arity: -1, Class: Admin, Flags: Fast, Summary: "get or set the connection's default consistency level"},
	{Name: "KEFIR.DURABILITY", Arity: -1, Class: Admin, Flags: Fast, Summary: "get or set the connection's default durability level"},
	{Name: "KEFIR.SESSION", Arity: -1, Class: Admin, Flags: Fast, Summary: "get or set the connection's session token"},
	{Name: "KEFIR.TOPOLOGY", Arity: 1, Class: Admin, Flags: Fast, Summary: "replica group: cluster, view, leader, nilext mode, members and their client addresses"},
	// Redis Cluster's surface (docs/cluster.md).
	{Name: "CLUSTER", Arity: -2, Class: Admin, Summary: "CLUSTER SLOTS | SHARDS | NODES | INFO | KEYSLOT key | MYID | COUNTKEYSINSLOT slot | GETKEYSINSLOT slot count | HELP"},
	{Name: "ASKING", Arity: 1, Class: Admin, Flags: Fast, Summary: "Redis Cluster's ASKING (marks a cluster client; docs/cluster.md)"},
	{Name: "KEFIR.GROUP", Arity: -2, Class: Admin, Summary: "a VR group's membership: CONFIG (epoch, members, addresses) | RECONFIG [EPOCH e] member... at the leader (kefir cluster replace-node, remove-node, add-members; EPOCH: refused with -EPOCHMOVED if the group moved on) | PROGRESS GROUP g (its followers' persisted ops, at the leader)"},
	{Name: "KEFIR.SLOTS", Arity: -2, Class: Admin, Summary: "slot moves' steps at a group's leader (kefir cluster move-slots): TABLE g | INIT g epoch ranges | SET g state peer epoch ranges | DUMP g ranges cursor limit since | LOAD g key meta payload ... | STATS g cursor limit since | READS (this node's reads per slot)"},
	{Name: "READONLY", Arity: 1, Class: Admin, Flags: Fast, Summary: "read from replicas: the connection's reads default to eventual"},
	{Name: "READWRITE", Arity: 1, Class: Admin, Flags: Fast, Summary: "undo READONLY: the connection's reads default to the node's level"},
	{Name: "KEFIR.CHAINVERSION", Arity: 3, Class: Admin, Flags: Fast, Summary: "internal (chain members): the tail's commit point, for a CRAQ read at another member: KEFIR.CHAINVERSION group epoch"},
	{Name: "KEFIR.NILEXT", Arity: -7, Class: Admin, Summary: "internal (Go client): take a nilext update into this replica's d-log: KEFIR.NILEXT client seq durability SET k v | MSET k v ..."},

	// Key expiry (docs/design/expiry.md). SETEX and PSETEX answer OK whatever the
	// state: nilext, like SET EX. The others answer what they found.
	{Name: "SETEX", Arity: 4, Class: NilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a key expiring in s seconds: SETEX key s value"},
	{Name: "PSETEX", Arity: 4, Class: NilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a key expiring in ms milliseconds: PSETEX key ms value"},
	{Name: "GETEX", Arity: -2, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "get a value and set or remove its expiry: GETEX key [EX s|PX ms|EXAT s|PXAT ms|PERSIST]"},
	{Name: "EXPIRE", Arity: -3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "expire a key in s seconds: EXPIRE key s [NX|XX|GT|LT]"},
	{Name: "PEXPIRE", Arity: -3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "expire a key in ms milliseconds: PEXPIRE key ms [NX|XX|GT|LT]"},
	{Name: "EXPIREAT", Arity: -3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "expire a key at a unix time in seconds [NX|XX|GT|LT]"},
	{Name: "PEXPIREAT", Arity: -3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "expire a key at a unix time in milliseconds [NX|XX|GT|LT]"},
	{Name: "PERSIST", Arity: 2, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "remove a key's expiry, answering 1 if it had one"},
	{Name: "TTL", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "seconds until a key expires (-1: never, -2: no key)"},
	{Name: "PTTL", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "milliseconds until a key expires (-1: never, -2: no key)"},
	{Name: "EXPIRETIME", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "unix time in seconds a key expires at (-1: never, -2: no key)"},
	{Name: "PEXPIRETIME", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "unix time in milliseconds a key expires at (-1: never, -2: no key)"},

	// Transactions (docs/design/transactions.md). MULTI, DISCARD and UNWATCH
	// shape the connection's transaction. EXEC proposes it as one op of the
	// log whose reply (the commands' replies) depends on state: an ordered
	// update, never the nilext fast path, whatever its commands. WATCH is a
	// (linearizable) read of the keys' versions. KEFIR.EXEC and KEFIR.WATCH
	// are what EXEC and WATCH send a leader from a follower.
	{Name: "MULTI", Arity: 1, Class: Admin, Flags: Fast, Summary: "start a transaction: the commands up to EXEC are queued"},
	{Name: "EXEC", Arity: 1, Class: NonNilextUpdate, Summary: "run the queued commands as one op of the log (null if a watched key changed)"},
	{Name: "DISCARD", Arity: 1, Class: Admin, Flags: Fast, Summary: "abandon a transaction and forget the watched keys"},
	{Name: "WATCH", Arity: -2, Class: Read, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "make the next EXEC fail if one of these keys changes before it"},
	{Name: "UNWATCH", Arity: 1, Class: Admin, Flags: Fast, Summary: "forget the watched keys"},
	{Name: "KEFIR.EXEC", Arity: -2, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 2, LastKey: -1, KeyStep: 1, Summary: "internal: a whole transaction (what EXEC proposes and a follower forwards): KEFIR.EXEC <encoded> key ..."},
	{Name: "KEFIR.EXECRO", Arity: -2, Class: Read, Flags: MultiKey, FirstKey: 2, LastKey: -1, KeyStep: 1, Summary: "internal: a transaction of reads only, served as a read: KEFIR.EXECRO <encoded> key ..."},
	{Name: "KEFIR.WATCH", Arity: -2, Class: Read, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "internal: what WATCH observes of each key (a follower asks the leader)"},
}

// maxNameLen bounds the names Lookup considers, so it can fold case on the stack.
const maxNameLen = 32

var byName = func() map[string]*Spec {
	table = append(table, keyspaceTable...)
	table = append(table, hashTable...)
	table = append(table, scriptTable...)
	table = append(table, itxTable...)
	table = appendUnsupported(table)
	m := make(map[string]*Spec, len(table))
	for i := range table {
		s := &table[i]
		s.ID = i
		if s.Name != strings.ToUpper(s.Name) || len(s.Name) > maxNameLen {
			panic("command: bad table name " + s.Name)
		}
		if _, dup := m[s.Name]; dup {
			panic("command: duplicate " + s.Name)
		}
		if s.Arity == 0 || s.Class == 0 {
			panic("command: incomplete spec " + s.Name)
		}
		m[s.Name] = s
	}
	return m
}()

// Lookup finds a command by name, case-insensitively, without allocating.
func Lookup(name []byte) (*Spec, bool) {
	if len(name) == 0 || len(name) > maxNameLen {
		return nil, false
	}
	// One pass upper-cases the name and hashes it; the table below is probed
	// with that hash. A Go map cost a pipelined HSET ~170 instructions per
	// lookup (hashing the name again, then its own probe), and the front door
	// looks a command up twice (docs/design/hashes.md, "Pipelined, session 21").
	var buf [maxNameLen]byte
	h := uint32(2166136261)
	for i, c := range name {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf[i] = c
		h = (h ^ uint32(c)) * 16777619 // FNV-1a
	}
	mask := uint32(len(byHash) - 1)
	for i := h; ; i++ {
		s := byHash[i&mask]
		if s == nil {
			return nil, false
		}
		if len(s.Name) == len(name) && s.Name == string(buf[:len(name)]) { // no conversion: compared in place
			return s, true
		}
	}
}

// byHash is Lookup's open-addressing table: a spec at the FNV-1a hash of its
// name, or the next free slot after it; at most a quarter full, so a probe
// reads one or two slots.
var byHash = func() []*Spec {
	size := 1
	for size < 4*len(byName) {
		size *= 2
	}
	t := make([]*Spec, size)
	for i := range table {
		s := &table[i]
		h := uint32(2166136261)
		for _, c := range []byte(s.Name) {
			h = (h ^ uint32(c)) * 16777619
		}
		for t[h&uint32(size-1)] != nil {
			h++
		}
		t[h&uint32(size-1)] = s
	}
	return t
}()

// MustLookup is Lookup for names known at compile time.
func MustLookup(name string) *Spec {
	s, ok := Lookup([]byte(name))
	if !ok {
		panic("command: unknown " + name)
	}
	return s
}

// All returns every spec, ordered by ID. The slice must not be modified.
func All() []*Spec {
	out := make([]*Spec, len(table))
	for i := range table {
		out[i] = &table[i]
	}
	return out
}

// Count is the number of commands in the table (IDs are 0..Count-1).
func Count() int { return len(table) }

// Names returns the command names sorted, for help texts.
func Names() []string {
	out := make([]string, 0, len(table))
	for i := range table {
		out = append(out, table[i].Name)
	}
	sort.Strings(out)
	return out
}

// Classify returns the class of a concrete invocation: argv[0] is the command name.
// It differs from Spec.Class only for DependsOnArgs commands: SET with NX, XX or GET is
// a non-nilext update; KEFIR.CALL takes the class of the command it wraps.
func Classify(s *Spec, argv [][]byte) Class {
	if !s.Has(DependsOnArgs) {
		return s.Class
	}
	switch s.Name {
	case "SET":
		for _, a := range argv[min(3, len(argv)):] {
			if eqFold(a, "NX") || eqFold(a, "XX") || eqFold(a, "GET") {
				return NonNilextUpdate
			}
		}
		return NilextUpdate
	case "KEFIR.CALL":
		// Skip option values so a value spelled "CMD" cannot confuse the scan.
		for i := 1; i < len(argv); {
			switch {
			case eqFold(argv[i], "CMD"):
				if i+1 >= len(argv) {
					return Admin
				}
				inner, ok := Lookup(argv[i+1])
				if !ok || inner.Has(Wrapper) {
					return Admin
				}
				return Classify(inner, argv[i+1:])
			case eqFold(argv[i], "REQID"):
				i += 3
			default:
				i += 2
			}
		}
		return Admin
	}
	return s.Class
}

func eqFold(b []byte, upper string) bool {
	return len(b) == len(upper) && bytes.EqualFold(b, []byte(upper))
}
