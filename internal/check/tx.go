package check

import "fmt"

// Watched increments (MULTI/EXEC with WATCH; docs/design/transactions.md).
// Clients increment one counter key by WATCH k, GET k, MULTI, SET k v+1,
// EXEC, retrying when EXEC answers null. Isolation means every committed
// transaction read a value no other committed one read, the counter moved by
// one per commit, and nothing else moved it: a lost update (two commits that
// read the same value, a WATCH that was not compared) breaks the first rule
// and leaves the final count short of the commits.

// Increment is one committed (EXEC answered an array) watched increment:
// Read is the value its GET saw (the one it wrote is Read+1).
type Increment struct {
	Client int
	Read   int64
}

// Increments checks the committed increments of key from initial against the
// final value read after every client finished.
func Increments(key string, initial int64, committed []Increment, final int64) Verdict {
	v := Verdict{Checker: "watched-increments", OK: true, Checked: len(committed)}
	by := map[int64]Increment{}
	for _, c := range committed {
		if c.Read < initial || c.Read >= initial+int64(len(committed)) {
			v.add(Violation{Key: key, Reason: fmt.Sprintf("client %d committed an increment of %d, outside [%d, %d): it read a value no commit produced", c.Client, c.Read, initial, initial+int64(len(committed)))})
			continue
		}
		if o, dup := by[c.Read]; dup {
			v.add(Violation{Key: key, Reason: fmt.Sprintf("clients %d and %d both committed an increment of %d: a lost update", o.Client, c.Client, c.Read)})
			continue
		}
		by[c.Read] = c
	}
	if want := initial + int64(len(committed)); final != want {
		v.add(Violation{Key: key, Reason: fmt.Sprintf("final value %d after %d committed increments from %d (want %d)", final, len(committed), initial, want)})
	}
	return v
}
