package server

import (
	"strings"
	"testing"
)

// Config.Zone is checked as kefir server's --zone is (kv.ValidZone): a
// program that embeds the server with a bad zone is refused at New, not
// left with a map follower whose every ask to record the zone the
// metadata group refuses (a log line every 10 s for ever).
func TestConfigValidateZone(t *testing.T) {
	for _, z := range []string{"", "eu-west-1a"} {
		if err := (Config{DataDir: "d", ClientAddr: "127.0.0.1:1", Zone: z}).Validate(); err != nil {
			t.Errorf("zone %q: %v", z, err)
		}
	}
	for _, z := range []string{"rack 1", "a,b", strings.Repeat("z", 65)} {
		if err := (Config{DataDir: "d", ClientAddr: "127.0.0.1:1", Zone: z}).Validate(); err == nil || !strings.Contains(err.Error(), "zone") {
			t.Errorf("zone %q: err = %v, want a refusal", z, err)
		}
	}
}
