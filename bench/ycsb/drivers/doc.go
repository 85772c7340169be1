// Package drivers connects the YCSB harness (internal/ycsb in the main module) to the
// peer systems it measures Kefir against: Redis through go-redis, etcd, ZooKeeper, and a
// trivial in-process RESP server whose only purpose is to show how fast the harness
// itself can go. Kefir's own driver is internal/ycsb/kefirdb, shared with `kefir bench`.
//
// It must not be imported by Kefir's main module (it pulls in go-redis).
package drivers
