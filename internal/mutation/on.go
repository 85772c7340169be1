//go:build mutations

package mutation

// On: this build was made with -tags mutations, for tests.
const On = true
