package script

import "time"

// mutations are deliberate bugs that tests switch on to show the
// determinism tests catch them (internal/mutation): read only as
// `mutation.On && mut.x`, so a production build has none.
type mutations struct {
	// skipRestore reuses an interpreter as the last script left it
	// (TestReusedInterpreterIsPristine must notice).
	skipRestore bool
	// processRandom seeds math.random from this process's clock, as
	// gopher-lua's own math.random does (TestScriptsAreDeterministic must
	// notice).
	processRandom bool
}

var mut mutations

// clockSeed is processRandom's seed.
func clockSeed() uint64 { return uint64(time.Now().UnixNano()) | 1 }
