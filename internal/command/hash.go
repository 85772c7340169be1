package command

// hashTable is issue 27's hash commands (docs/design/hashes.md), appended to
// table at init (kept apart to ease merging).
//
// Classes: every hash write answers something that depends on the state it
// found — HSET the number of new fields, HSETNX 0/1, HDEL the number
// removed, HINCRBY/HINCRBYFLOAT the new value — so each is non-nilext.
// HMSET answers OK whatever it found, but it is ordered too: the metadata
// record it writes holds the field count, which depends on which fields
// existed, so it is no blind write (the fast path's overlay serves blind
// writes' records before they are applied; this one's are known only at
// apply). The reads are reads.
var hashTable = []Spec{
	{Name: "HSET", Arity: -4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set hash fields, answering how many are new: HSET key field value [field value ...]"},
	{Name: "HMSET", Arity: -4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set hash fields, answering OK"},
	{Name: "HSETNX", Arity: 4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "set a hash field if it does not exist"},
	{Name: "HDEL", Arity: -3, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "delete hash fields, answering how many existed"},
	{Name: "HINCRBY", Arity: 4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "add an integer to a hash field"},
	{Name: "HINCRBYFLOAT", Arity: 4, Class: NonNilextUpdate, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "add a decimal to a hash field"},
	{Name: "HGET", Arity: 3, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "value of a hash field"},
	{Name: "HMGET", Arity: -3, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "values of hash fields"},
	{Name: "HEXISTS", Arity: 3, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "whether a hash field exists"},
	{Name: "HSTRLEN", Arity: 3, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "length of a hash field's value"},
	{Name: "HLEN", Arity: 2, Class: Read, Flags: Fast, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "number of fields of a hash"},
	{Name: "HGETALL", Arity: 2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "every field and value of a hash"},
	{Name: "HKEYS", Arity: 2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "every field of a hash"},
	{Name: "HVALS", Arity: 2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "every value of a hash"},
	{Name: "HSCAN", Arity: -3, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "iterate a hash: HSCAN key cursor [MATCH pattern] [COUNT n] [NOVALUES]"},
	{Name: "HRANDFIELD", Arity: -2, Class: Read, FirstKey: 1, LastKey: 1, KeyStep: 1, Summary: "random fields of a hash: HRANDFIELD key [count [WITHVALUES]]"},
}
