// Package ycsb is the YCSB harness: the core workloads (A–F and the write-only W), the
// load and run phases, closed-loop and open-loop clients, and HDR-style histograms.
// A system under test plugs in as a DB: Kefir's driver is internal/ycsb/kefirdb, the peer
// systems' drivers live in the bench module (bench/ycsb/drivers). `kefir bench` and the
// comparison harness (bench/ycsb) both run it, so there is one copy of the workloads.
//
// Open loop measures latency from each operation's intended start time, not from when
// the client got round to sending it, so a stall is charged to every operation it
// delayed (no coordinated omission; Tene, "How NOT to Measure Latency").
//
// It must not import any other Kefir package (only its own gen): Kefir is one DB among
// several here, plugged in like the others (kefirdb).
package ycsb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/ycsb/gen"
)

// ErrNotFound is what a DB returns when a read finds no value. The runner counts it
// apart from errors: YCSB reports it as NOT_FOUND, and in a correct run it is zero.
var ErrNotFound = errors.New("ycsb: not found")

// DB is one client's handle on the system under test. The runner gives each client its
// own DB (drivers may share a connection pool behind it) and calls it from one goroutine.
type DB interface {
	Read(ctx context.Context, key string) ([]byte, error)
	// Update overwrites an existing key's value.
	Update(ctx context.Context, key string, value []byte) error
	// Insert writes a new key.
	Insert(ctx context.Context, key string, value []byte) error
	// Scan reads up to count consecutive keys from start (inclusive) and returns how many it read.
	Scan(ctx context.Context, start string, count int) (int, error)
	Close() error
}

// Workload is a YCSB core workload's parameters (YCSB's CoreWorkload properties).
type Workload struct {
	Name string `json:"name"`
	// RecordCount is the number of records the load phase inserts (recordcount).
	RecordCount uint64 `json:"recordcount"`
	// ValueSize is the bytes of one record: YCSB's fieldcount × fieldlength (10 × 100).
	// A key-value store holds the record as one value.
	ValueSize int `json:"value_size"`

	ReadProportion   float64 `json:"readproportion"`
	UpdateProportion float64 `json:"updateproportion"`
	InsertProportion float64 `json:"insertproportion"`
	ScanProportion   float64 `json:"scanproportion"`
	RMWProportion    float64 `json:"readmodifywriteproportion"`

	// RequestDistribution is uniform, zipfian (scrambled) or latest.
	RequestDistribution string  `json:"requestdistribution"`
	ZipfianTheta        float64 `json:"zipfian_theta"`
	// MaxScanLength bounds scans; their length is uniform in [1, MaxScanLength].
	MaxScanLength int `json:"maxscanlength"`
	// OrderedInserts names keys by their number instead of its hash (insertorder=ordered).
	OrderedInserts bool `json:"ordered_inserts"`
}

// Op is an operation type.
type Op int

// Operation types, in report order.
const (
	OpRead Op = iota
	OpUpdate
	OpInsert
	OpScan
	OpRMW
	numOps
)

var opNames = [numOps]string{"READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"}

func (o Op) String() string { return opNames[o] }

// Standard returns YCSB's core workload by letter (a–f), or w: write-only (100% update,
// zipfian), the workload Kefir's durability modes are compared on. Defaults are YCSB's:
// 1000-byte records, zipfian θ = 0.99, scans up to 100 keys.
func Standard(name string) (Workload, error) {
	w := Workload{Name: strings.ToLower(name), RecordCount: 100_000, ValueSize: 1000,
		RequestDistribution: "zipfian", ZipfianTheta: gen.ZipfianConstant, MaxScanLength: 100}
	switch w.Name {
	case "a": // update heavy: session store recording recent actions
		w.ReadProportion, w.UpdateProportion = 0.5, 0.5
	case "b": // read mostly: photo tagging
		w.ReadProportion, w.UpdateProportion = 0.95, 0.05
	case "c": // read only: user profile cache
		w.ReadProportion = 1
	case "d": // read latest: user status updates
		w.ReadProportion, w.InsertProportion, w.RequestDistribution = 0.95, 0.05, "latest"
	case "e": // short ranges: threaded conversations
		w.ScanProportion, w.InsertProportion = 0.95, 0.05
	case "f": // read-modify-write: user database
		w.ReadProportion, w.RMWProportion = 0.5, 0.5
	case "w": // write only
		w.UpdateProportion = 1
	default:
		return Workload{}, fmt.Errorf("unknown workload %q (want a, b, c, d, e, f or w)", name)
	}
	return w, nil
}

// Validate checks the proportions and parameters.
func (w Workload) Validate() error {
	sum := w.ReadProportion + w.UpdateProportion + w.InsertProportion + w.ScanProportion + w.RMWProportion
	if sum < 0.999 || sum > 1.001 {
		return fmt.Errorf("workload %s: proportions sum to %v, want 1", w.Name, sum)
	}
	switch w.RequestDistribution {
	case "uniform", "zipfian", "latest":
	default:
		return fmt.Errorf("workload %s: unknown request distribution %q", w.Name, w.RequestDistribution)
	}
	if w.RecordCount == 0 || w.ValueSize <= 0 {
		return fmt.Errorf("workload %s: recordcount and value size must be positive", w.Name)
	}
	if w.ScanProportion > 0 && w.MaxScanLength < 1 {
		return fmt.Errorf("workload %s: scans need maxscanlength ≥ 1", w.Name)
	}
	return nil
}

// HasScans reports whether the workload scans (drivers of unordered stores then keep an index).
func (w Workload) HasScans() bool { return w.ScanProportion > 0 }

// cumulative returns the op-choice thresholds.
func (w Workload) cumulative() [numOps]float64 {
	var c [numOps]float64
	acc := 0.0
	for op, p := range [numOps]float64{w.ReadProportion, w.UpdateProportion, w.InsertProportion, w.ScanProportion, w.RMWProportion} {
		acc += p
		c[op] = acc
	}
	c[numOps-1] = 2 // rounding never falls off the end
	return c
}

// KeyName returns record keynum's key: "user" followed by the FNV hash of the number
// (or the number, zero-padded, for ordered inserts), as YCSB names them.
func (w Workload) KeyName(dst []byte, keynum uint64) []byte {
	dst = append(dst[:0], "user"...)
	if w.OrderedInserts {
		s := strconv.FormatUint(keynum, 10)
		for range 20 - len(s) {
			dst = append(dst, '0')
		}
		return append(dst, s...)
	}
	return strconv.AppendUint(dst, gen.FNV64(keynum), 10)
}
