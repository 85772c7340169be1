package check

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Options configures All.
type Options struct {
	Lin     LinOptions
	Session SessionOptions
	// Dir, if set, receives history.json and, for a linearizability failure,
	// the porcupine visualization: a report that can be re-checked later
	// (LoadJSON) and read by a human.
	Dir string
}

// All runs every checker and returns their verdicts, in a fixed order:
// linearizable, session, cross-client-monotonic, monotonic-state,
// bounded-staleness, durability.
// Each checker only judges the operations whose levels promise what it checks,
// so running all of them on any history is meaningful.
func All(h History, o Options) []Verdict {
	if o.Dir != "" && o.Lin.VisualizationDir == "" {
		o.Lin.VisualizationDir = o.Dir
	}
	vs := []Verdict{
		Linearizable(h, o.Lin),
		Session(h, o.Session),
		CrossClientMonotonic(h),
		MonotonicState(h),
		BoundedStaleness(h),
		Durability(h),
	}
	if o.Dir != "" {
		if err := SaveJSON(h, filepath.Join(o.Dir, "history.json")); err != nil {
			vs[0].Note += fmt.Sprintf("; saving history: %v", err)
		}
	}
	return vs
}

// Errs joins the failing verdicts into one error (nil if all passed).
func Errs(vs []Verdict) error {
	var errs []error
	for _, v := range vs {
		if err := v.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SaveJSON writes h to path (creating its directory).
func SaveJSON(h History, path string) error { return saveJSON(h, path) }

// SaveTxnJSON writes a transaction history to path, for LoadTxnJSON.
func SaveTxnJSON(h TxnHistory, path string) error { return saveJSON(h, path) }

// LoadTxnJSON reads a transaction history written by SaveTxnJSON.
func LoadTxnJSON(path string) (TxnHistory, error) {
	var h TxnHistory
	if err := loadJSON(path, &h); err != nil {
		return TxnHistory{}, err
	}
	for i := range h.Txns {
		if h.Txns[i].ID != i {
			return TxnHistory{}, fmt.Errorf("check: transaction history %s: T%d has id %d", path, i, h.Txns[i].ID)
		}
	}
	return h, nil
}

func saveJSON(h any, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("check: history dir: %w", err)
	}
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return fmt.Errorf("check: encode history: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("check: write history: %w", err)
	}
	return nil
}

// LoadJSON reads a history written by SaveJSON.
func LoadJSON(path string) (History, error) {
	var h History
	if err := loadJSON(path, &h); err != nil {
		return History{}, err
	}
	for i := range h.Ops {
		if h.Ops[i].ID != i {
			return History{}, fmt.Errorf("check: history %s: op %d has id %d", path, i, h.Ops[i].ID)
		}
	}
	return h, nil
}

func loadJSON(path string, h any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("check: read history: %w", err)
	}
	if err := json.Unmarshal(b, h); err != nil {
		return fmt.Errorf("check: decode history %s: %w", path, err)
	}
	return nil
}
