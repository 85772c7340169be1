package vrshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// The nilext fast path acknowledges a write before it is applied, so it must
// not take one that apply will reject: an MSET with a reserved key (apply
// fails it whole: acknowledged OK, it would write nothing) or a SET with a key
// above the engine's limit (its apply would stop every replica). NilextApply
// hands such writes back as fallbacks with no id (nothing sent), the ordered
// path answers them with their error, the valid writes of the batch complete
// fast, and no replica stops; NilextTake refuses a reserved key. With the
// nilextUnchecked mutation the invalid writes are acknowledged OK.
func TestNilextFastPathTakesNoWriteApplyWillReject(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "checked", true: "nilextUnchecked"}[broken], func(t *testing.T) {
			bad := nilextInvalidBatch(t, broken)
			switch {
			case broken && len(bad) == 0:
				t.Fatal("nilextUnchecked: every invalid write was still refused; the mutation was not exercised")
			case broken:
				for _, b := range bad {
					t.Logf("caught: %s", b)
				}
			default:
				for _, b := range bad {
					t.Error(b)
				}
			}
		})
	}
}

func nilextInvalidBatch(t *testing.T, broken bool) (bad []string) {
	if broken {
		mutation.Require(t)
	}
	c := newCluster(t, 3, func(o *Options) {
		nilextOn(false)(o)
		o.mut.nilextUnchecked = broken
	})
	l := c.leader(5 * time.Second)
	leader := c.reps[l]
	ctx := context.Background()
	reserved := append([]byte(nil), kv.ReservedPrefix...)
	reqs := []shard.WriteReq{
		{Op: set("a", "1"), Durability: level.Sync},
		{Op: kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("k"), []byte("v1"), reserved, []byte("x")}}, Durability: level.Sync},
		{Op: set(strings.Repeat("b", 64<<10+1), "v"), Durability: level.CAD},
		{Op: set("e", "3"), Durability: level.Sync},
	}
	if broken {
		reqs = reqs[:2] // the oversize key would stop the group; the reserved key shows the hole
	}
	fb, err := leader.NilextApply(ctx, reqs)
	if err != nil {
		t.Fatalf("NilextApply: %v", err)
	}
	isFB := map[int]bool{}
	for _, i := range fb {
		isFB[i] = true
	}
	for i := range reqs {
		valid := i == 0 || i == 3
		switch {
		case valid && isFB[i]:
			t.Fatalf("valid write %d fell back (fallbacks %v): the fast path did not run", i, fb)
		case valid && reqs[i].Err != nil:
			t.Fatalf("valid write %d: %v", i, reqs[i].Err)
		case !valid && !isFB[i]:
			bad = append(bad, fmt.Sprintf("write %d (apply rejects it) completed on the fast path: %+v", i, reqs[i].Result))
		case !valid && !reqs[i].ID.IsZero():
			bad = append(bad, fmt.Sprintf("write %d fell back with id %v: it was sent", i, reqs[i].ID))
		}
	}
	if len(fb) > 0 {
		sub := make([]shard.WriteReq, len(fb))
		for j, i := range fb {
			sub[j] = reqs[i]
		}
		p, err := leader.Apply(ctx, sub)
		if err != nil {
			t.Fatalf("Apply of the fallbacks: %v", err)
		}
		if err := leader.Wait(ctx, p); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		for j, i := range fb {
			if sub[j].Err == nil {
				bad = append(bad, fmt.Sprintf("write %d through the ordered path: %+v; want an error", i, sub[j].Result))
			}
		}
	}
	if _, err := leader.NilextTake(ctx, shard.ReqID{Client: 77, Seq: 1}, reqs[1].Op, level.Sync); err == nil {
		bad = append(bad, "NilextTake took an MSET with a reserved key")
	} else if !broken && !errors.Is(err, ErrNilextInvalid) {
		t.Fatalf("NilextTake of an MSET with a reserved key: %v; want ErrNilextInvalid", err)
	}
	if v, err := c.linGet(l, "k"); err != nil || v != "" {
		t.Fatalf("k = %q, %v; want absent", v, err)
	}
	time.Sleep(200 * time.Millisecond)
	for i, r := range c.reps {
		if err := r.failed(); err != nil {
			bad = append(bad, fmt.Sprintf("replica %d stopped: %v", i, err))
		}
	}
	return bad
}
