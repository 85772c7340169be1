//go:build !mutations

package mutation

// On: the default (production) build: every mutation is compiled away.
const On = false
