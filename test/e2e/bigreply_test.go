package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A write whose reply the group cannot record in its client's row (over
// max-bulk: a forwarded write, one with KEFIR.CALL REQID or a Go client's
// session) applies and answers, and the group carries on: it had failed the
// batch's append on every replica (which stopped), and again at each
// restart's replay. GETDEL of a value of max-bulk bytes did it, as does
// KEYS * inside MULTI over a large keyspace.
func TestGroupWriteWithAReplyOverMaxBulk(t *testing.T) {
	g := startGroupWith(t, "--max-bulk", "4096")
	l := g.settledLeader(-1)
	// Through a follower: it forwards the write with a request id, so the
	// leader records its reply in a client row (a write sent to the leader
	// directly has none).
	addr := g.nodes[(l+1)%3].ClientAddr
	big := strings.Repeat("v", 4096)
	if got := redisCLIWrite(t, addr, "SET", "big", big); got != "OK" {
		t.Fatalf("SET big: %q", got)
	}
	cli := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		host, port, _ := strings.Cut(addr, ":")
		out, _ := exec.CommandContext(ctx, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if got := cli("GETDEL", "big"); got != big {
		t.Fatalf("GETDEL big: %.200q", got)
	}
	if got := cli("SET", "after", "1"); got != "OK" {
		t.Fatalf("SET after the GETDEL: %.200q (the group stopped?)", got)
	}
	if got := cli("EXISTS", "big"); got != "0" {
		t.Fatalf("EXISTS big: %q after its GETDEL", got)
	}
}
