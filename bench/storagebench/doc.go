// Command storagebench measures Kefir's storage engine (internal/storage) side by side
// with Pebble and bbolt on the same workloads and the same durability (issue 2,
// "Performance"): synced puts from 1/16/64 concurrent writers with 100 B and 1 KiB
// values, point gets (uniform and scrambled-zipfian hot keys), 100-key range scans,
// reopen time over 1M keys, and resident memory per key. Every figure is the median of
// several runs; within a run the engines take turns cell by cell (in a rotating order),
// so machine noise hits all of them alike.
//
// Run from bench/:
//
//	go run ./storagebench                          # default matrix, ≤ 5 minutes
//	go run ./storagebench -md results/storage.md -json results/storage.json
//	go run ./storagebench -profile-dir /tmp/prof   # CPU profiles of Kefir's cells
//
// The benchmark checks what it measures: every get compares the value returned with the
// value loaded, every writer's last put is read back after the phase, and a miss or a
// wrong value fails the run instead of producing a figure.
//
// It lives in the bench module so Pebble and bbolt never enter Kefir's main module; it
// must not be imported by anything.
package main
