//go:build race

package vrshard

// raceOn: the race detector slows every step 5–10×, so tests of timing-bound
// figures (an fsync count that depends on the next write arriving within a
// hold's deadline) measure the detector, not the code; they skip under it.
const raceOn = true
