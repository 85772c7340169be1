package check

import (
	"sort"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Hashes (issue 27): a key holding a hash of fields, under HSET, HDEL, HGET,
// HGETALL, HLEN, DEL and EXPIRE (far in the future: it changes no content,
// and answers whether the key exists). Each op on the key is atomic: a
// multi-field HSET sets all its fields or none, DEL takes every field, a
// field written stays until it is deleted. LinearizableHashes judges a
// history of them per key with porcupine, like Linearizable judges
// registers; a lost field, a field back after DEL of its hash, or a torn
// HSET (some of its fields seen without the others) has no linearization.

// EncodeHash is the canonical form of a hash's contents (HGetAll's Result):
// its field=value pairs in field order, one per line. Fields and values
// must not contain '\n' or '='... the workloads' do not.
func EncodeHash(fields map[string]string) string {
	keys := make([]string, 0, len(fields))
	for f := range fields {
		keys = append(keys, f)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, f := range keys {
		b.WriteString(f)
		b.WriteByte('=')
		b.WriteString(fields[f])
		b.WriteByte('\n')
	}
	return b.String()
}

func decodeHash(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if f, v, ok := strings.Cut(line, "="); ok {
			m[f] = v
		}
	}
	return m
}

// hashStep is the hash model's step; the state is EncodeHash of the
// contents (a string: comparable, cheap to hash for porcupine).
func hashStep(state, input, _ interface{}) (bool, interface{}) {
	s := state.(string)
	op := input.(*Op)
	known := op.Outcome == OK
	m := decodeHash(s)
	switch op.Kind {
	case HSet:
		added := 0
		for i := 0; i+1 < len(op.Fields); i += 2 {
			if _, ok := m[op.Fields[i]]; !ok {
				added++
			}
			m[op.Fields[i]] = op.Fields[i+1]
		}
		if known && op.Result != strconv.Itoa(added) {
			return false, s
		}
		return true, EncodeHash(m)
	case HDel:
		removed := 0
		for _, f := range op.Fields {
			if _, ok := m[f]; ok {
				removed++
				delete(m, f)
			}
		}
		if known && op.Result != strconv.Itoa(removed) {
			return false, s
		}
		return true, EncodeHash(m)
	case Delete:
		if known && op.Found != (len(m) > 0) {
			return false, s
		}
		return true, ""
	case HExpire:
		return !known || op.Found == (len(m) > 0), s
	case HGet:
		v, ok := m[op.Fields[0]]
		return !known || (op.Found == ok && (!ok || op.Result == v)), s
	case HGetAll:
		return !known || op.Result == s, s
	case HLen:
		return !known || op.Result == strconv.Itoa(len(m)), s
	}
	panic("check: the hash model has no op " + op.Kind.String())
}

// HashModel is the porcupine model of one key holding a hash.
var HashModel = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: hashStep,
	DescribeOperation: func(input, _ interface{}) string {
		s := input.(*Op).String()
		if i := strings.Index(s, " ["); i >= 0 {
			s = s[:i]
		}
		return s
	},
	DescribeState: func(state interface{}) string {
		return strconv.Quote(state.(string))
	},
}

// LinearizableHashes checks per-key linearizability of a history of hash
// ops (HSet, HDel, HGet, HGetAll, HLen, HExpire, Delete) with HashModel,
// with Linearizable's options, search and shrinking. By default only reads
// at the linearizable (or default) level are judged.
func LinearizableHashes(h History, o LinOptions) Verdict {
	return linearizable(h, o, HashModel, "linearizable-hashes")
}
