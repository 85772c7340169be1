package command

import "strings"

// keyspaceTable is issue 27's iteration, housekeeping and string long-tail
// commands, appended to table at init (kept apart to ease merging).
//
// Classes: a write whose reply depends on the state it found is non-nilext
// (RENAME's "no such key", COPY's and RENAMENX's 0/1, SETRANGE's new length,
// INCRBYFLOAT's new value, MSETNX's 0/1, SETBIT's old bit, GETDEL's value).
// FLUSHDB and FLUSHALL answer OK whatever they found, but they are ordered
// before they reply too: a nilext update is acknowledged from the d-log by
// the keys it names, and a flush names none (it updates every key), so no
// read could tell it is pending.
var keyspaceTable = []Spec{
	{Name: "SCAN", Arity: -2, Class: Read, Summary: "iterate the keyspace: SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]"},
	{Name: "KEYS", Arity: 2, Class: Read, Summary: "every key matching a glob pattern"},
	{Name: "RANDOMKEY", Arity: 1, Class: Read, Summary: "a key picked at random (nil if none)"},
	{Name: "TYPE", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "the type of a key's value: string or none"},
	{Name: "TOUCH", Arity: -2, Class: Read, Flags: MultiKey | Fast, FirstKey: 1, LastKey: -1, KeyStep: 1, Summary: "count of the given keys that exist (Kefir keeps no access time)"},
	{Name: "OBJECT", Arity: -2, Class: Read, FirstKey: 2, LastKey: 2, KeyStep: 1, Summary: "OBJECT ENCODING key (FREQ and IDLETIME are not tracked)"},
	{Name: "GETRANGE", Arity: 4, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "a substring of a value"},
	{Name: "SUBSTR", Arity: 4, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "same as GETRANGE"},
	{Name: "GETBIT", Arity: 3, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "one bit of a value"},
	{Name: "BITFIELD_RO", Arity: -2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "BITFIELD's GET subcommands only: BITFIELD_RO key [GET type off]..."},
	{Name: "BITCOUNT", Arity: -2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "count set bits: BITCOUNT key [start end [BYTE|BIT]]"},
	{Name: "LCS", Arity: -3, Class: Read, FirstKey: 1, LastKey: 2, KeyStep: 1, Summary: "longest common subsequence of two values: LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]"},
	{Name: "BITPOS", Arity: -3, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "first bit set or clear: BITPOS key bit [start [end [BYTE|BIT]]]"},

	{Name: "FLUSHDB", Arity: -1, Class: NonNilextUpdate, Summary: "delete every key, atomically and durably: FLUSHDB [ASYNC|SYNC]"},
	{Name: "FLUSHALL", Arity: -1, Class: NonNilextUpdate, Summary: "same as FLUSHDB (only database 0 exists)"},
	{Name: "RENAME", Arity: 3, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: 2, KeyStep: 1, Summary: "rename a key"},
	{Name: "RENAMENX", Arity: 3, Class: NonNilextUpdate, Flags: MultiKey | Fast, FirstKey: 1, LastKey: 2, KeyStep: 1, Summary: "rename a key if the new name does not exist"},
	{Name: "COPY", Arity: -3, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: 2, KeyStep: 1, Summary: "copy a key: COPY source destination [REPLACE] (no DB option)"},
	{Name: "GETDEL", Arity: 2, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "delete a key, answering its value"},
	{Name: "SETRANGE", Arity: 4, Class: NonNilextUpdate, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "overwrite part of a value, answering the new length"},
	{Name: "INCRBYFLOAT", Arity: 3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "add a decimal to a value, answering the new value"},
	{Name: "MSETNX", Arity: -3, Class: NonNilextUpdate, Flags: MultiKey, FirstKey: 1, LastKey: -1, KeyStep: 2, Summary: "set several keys if none exists"},
	{Name: "SETBIT", Arity: 4, Class: NonNilextUpdate, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set one bit, answering the old one"},
	{Name: "BITFIELD", Arity: -2, Class: NonNilextUpdate, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "integers at bit offsets: BITFIELD key [GET type off] [SET type off value] [INCRBY type off incr] [OVERFLOW WRAP|SAT|FAIL]..."},
}

// unsupportedNames are Redis commands Kefir knows of but does not implement.
// They answer UnsupportedError's text rather than "unknown command", so a
// client (redis-benchmark running its default suite) learns the server
// understood the request and chose not to run it. A name the table already
// has (implemented since) is skipped, so implementing one only adds its spec.
var unsupportedNames = strings.Fields(`
	LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP LRANGE LLEN LINDEX LSET LREM LTRIM LINSERT LPOS LMOVE BLPOP BRPOP BLMOVE RPOPLPUSH BRPOPLPUSH LMPOP BLMPOP
	SADD SREM SPOP SMEMBERS SISMEMBER SMISMEMBER SCARD SRANDMEMBER SMOVE SINTER SINTERSTORE SINTERCARD SUNION SUNIONSTORE SDIFF SDIFFSTORE SSCAN
	ZADD ZREM ZRANGE ZRANGEBYSCORE ZRANGEBYLEX ZREVRANGE ZREVRANGEBYSCORE ZREVRANGEBYLEX ZRANGESTORE ZRANK ZREVRANK ZSCORE ZMSCORE ZCARD ZCOUNT ZLEXCOUNT ZINCRBY ZPOPMIN ZPOPMAX BZPOPMIN BZPOPMAX ZMPOP BZMPOP ZRANDMEMBER ZREMRANGEBYSCORE ZREMRANGEBYRANK ZREMRANGEBYLEX ZUNION ZUNIONSTORE ZINTER ZINTERSTORE ZINTERCARD ZDIFF ZDIFFSTORE ZSCAN
	PFADD PFCOUNT PFMERGE PFDEBUG PFSELFTEST XSETID XADD XRANGE XREVRANGE XLEN XREAD XREADGROUP XDEL XTRIM XACK XGROUP XINFO XPENDING XCLAIM XAUTOCLAIM
	GEOADD GEODIST GEOHASH GEOPOS GEOSEARCH GEOSEARCHSTORE GEORADIUS GEORADIUSBYMEMBER GEORADIUS_RO GEORADIUSBYMEMBER_RO
	BITOP BITFIELD BITFIELD_RO SORT SORT_RO DUMP RESTORE RESTORE-ASKING MIGRATE MOVE SWAPDB
	PUBLISH SUBSCRIBE UNSUBSCRIBE PSUBSCRIBE PUNSUBSCRIBE SSUBSCRIBE SUNSUBSCRIBE SPUBLISH PUBSUB
	EVAL EVALSHA EVAL_RO EVALSHA_RO SCRIPT FUNCTION FCALL FCALL_RO
	SAVE BGSAVE BGREWRITEAOF LASTSAVE SHUTDOWN SLAVEOF REPLICAOF REPLCONF PSYNC SYNC MONITOR DEBUG SLOWLOG LATENCY MEMORY MODULE ACL CLUSTER READONLY READWRITE ASKING WAIT WAITAOF FAILOVER RESET LOLWUT TIME ROLE
`)

// appendUnsupported adds a spec for every name of unsupportedNames not in t.
func appendUnsupported(t []Spec) []Spec {
	have := make(map[string]bool, len(t))
	for i := range t {
		have[t[i].Name] = true
	}
	for _, n := range unsupportedNames {
		if have[n] {
			continue
		}
		have[n] = true
		t = append(t, Spec{Name: n, Arity: -1, Class: Admin, Flags: Unsupported, Summary: "not supported by Kefir"})
	}
	return t
}

// UnsupportedError is the one reply text for a command Kefir knows but does
// not implement (Unsupported), documented in docs/commands.md. An unknown
// name gets Redis's own "unknown command" text instead (the server's).
func UnsupportedError(name string) string {
	return "ERR unsupported command '" + strings.ToLower(name) + "': Kefir does not implement it (see docs/commands.md)"
}
