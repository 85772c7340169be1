// Package mutation gates the deliberate bugs ("mutations") that tests switch
// on to prove that the simulator, the checkers and the crash tests catch them
// (docs/design/one-house.md, "Test and measurement switches out of
// production"). A mutation is a field of a package's unexported mutations
// struct that only tests set; every production read of one is written
//
//	if mutation.On && r.mut.ackBeforePersist { ... }
//
// On is a constant: false in the default build, so the compiler drops the
// guarded code and a production binary carries no mutation path; true only
// with `-tags mutations`, which `make test` and .ci/run use for the test
// suite. TestEveryMutationReadIsGated (this package's tests) fails if a read
// of a mutation in a non-test file of a gated package is not guarded by On.
//
// The package is pure (constants and one helper without imports), so the
// protocol cores may import it.
package mutation

// TB is the part of testing.TB that Require needs (this package must not
// import testing: production code imports it).
type TB interface {
	Helper()
	Skip(args ...any)
}

// Require skips a test that switches a mutation on when the build has no
// mutations tag: there the mutation does nothing, and a test that expects it
// caught would fail for the wrong reason. `make test` runs with the tag.
func Require(t TB) {
	if !On {
		t.Helper()
		t.Skip("switches a mutation on: run with -tags mutations (make test does)")
	}
}
