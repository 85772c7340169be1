//go:build !race

package vrshard

const raceOn = false
