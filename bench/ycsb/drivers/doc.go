// Package drivers connects the YCSB harness (bench/ycsb/core) to the systems it
// measures: Kefir through its Go client (every consistency and durability level as a
// parameter), Redis through go-redis, and a trivial in-process RESP server whose only
// purpose is to show how fast the harness itself can go.
//
// It must not be imported by Kefir's main module (it pulls in go-redis).
package drivers
