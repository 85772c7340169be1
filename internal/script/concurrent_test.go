package script

import (
	"strings"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// Scripts run concurrently (EVAL_RO on connection goroutines, EVAL on an
// apply loop) share compiled scripts and the pool of interpreters, nothing
// else: each gets its answer (run with -race to check the sharing).
func TestConcurrentScripts(t *testing.T) {
	body := []byte(`local t = {} for i = 1, 100 do t[i] = string.rep('x', i % 7) end return {#t, math.random(100), redis.call('get', KEYS[1])}`)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				op := kv.Op{Kind: kv.KindEvalRO, Value: body, Delta: 1, Keys: [][]byte{[]byte("k")}}
				get := func(k []byte) ([]byte, []byte, uint64, bool, error) { return []byte("v"), nil, 1, true, nil }
				res, err := kv.Read(get, nil, &op, 0)
				if err != nil || !strings.HasPrefix(string(res.Bulk), "*3\r\n:100\r\n:") || !strings.HasSuffix(string(res.Bulk), "$1\r\nv\r\n") {
					t.Errorf("%q %v", res.Bulk, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
