package command

// scriptTable is issue 27's scripting commands (docs/design/scripting.md),
// appended to table at init (kept apart to ease merging).
//
// Classes: a script's reply is whatever it returns, computed from the state
// it ran against, so EVAL and EVALSHA are ordered, externalizing updates
// (never nilext). EVAL_RO and EVALSHA_RO may only read: reads, served at the
// connection's consistency level like a scan of the whole keyspace (a
// script may read keys it did not declare). SCRIPT manages the node's own
// cache of script bodies: admin.
//
// Keys: a script names its keys after numkeys, so their position depends on
// the arguments (Redis's "movablekeys"); FirstKey is 0 here, and whoever
// needs them (the cluster's slot check) reads numkeys (ScriptKeys). A script
// may touch keys it did not declare, as Redis allows outside a cluster.
var scriptTable = []Spec{
	{Name: "EVAL", Arity: -3, Class: NonNilextUpdate, Summary: "run a Lua script: EVAL script numkeys [key ...] [arg ...]"},
	{Name: "EVALSHA", Arity: -3, Class: NonNilextUpdate, Summary: "run a cached Lua script by its SHA1: EVALSHA sha1 numkeys [key ...] [arg ...]"},
	{Name: "EVAL_RO", Arity: -3, Class: Read, Summary: "run a read-only Lua script (writes are refused)"},
	{Name: "EVALSHA_RO", Arity: -3, Class: Read, Summary: "run a cached read-only Lua script by its SHA1"},
	{Name: "SCRIPT", Arity: -2, Class: Admin, Summary: "the node's script cache: SCRIPT LOAD script | EXISTS sha1 ... | FLUSH [ASYNC|SYNC] | KILL"},
}

// ScriptKeys returns the keys a script command (EVAL, EVALSHA, EVAL_RO,
// EVALSHA_RO) declares: the numkeys arguments after numkeys. Nil if numkeys
// is not a number in range (the command is refused anyway).
func ScriptKeys(args [][]byte) [][]byte {
	if len(args) < 3 {
		return nil
	}
	n := 0
	for _, c := range args[2] {
		if c < '0' || c > '9' || n > len(args) {
			return nil
		}
		n = n*10 + int(c-'0')
	}
	if len(args[2]) == 0 || 3+n > len(args) {
		return nil
	}
	return args[3 : 3+n]
}

// ParseNumKeys reads a script command's numkeys, args[2], with Redis's
// checks and errors: the front door's EVAL and an EVAL inside MULTI (run at
// EXEC, as Redis checks it there).
func ParseNumKeys(args [][]byte) (int64, error) {
	n, err := ParseInt(args[2])
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, ReplyError("ERR Number of keys can't be negative")
	}
	if n > int64(len(args)-3) {
		return 0, ReplyError("ERR Number of keys can't be greater than number of args")
	}
	return n, nil
}
