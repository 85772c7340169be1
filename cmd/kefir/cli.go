package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/resp"
)

type cliFlags struct {
	addr, password, consistency, durability string
	json, tls, insecure                     bool
	limit                                   int
	timeout                                 time.Duration
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments ("kefir get k --json" and "kefir --json get k" both work).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func runClient(cmd string, args []string, stdout, stderr io.Writer) error {
	var f cliFlags
	fs := flag.NewFlagSet("kefir "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.addr, "addr", envOr("KEFIR_ADDR", "127.0.0.1:6380"), "node client address (env KEFIR_ADDR)")
	// The env value is applied after parsing, not as the flag default: --help
	// prints defaults, and must not print the secret.
	fs.StringVar(&f.password, "password", "", "password (env KEFIR_PASSWORD)")
	fs.StringVar(&f.consistency, "consistency", "", "read consistency (linearizable, cross-client-monotonic, session, bounded(N), bounded(DURATION), eventual)")
	fs.StringVar(&f.durability, "durability", "", "write durability (sync, cad, async)")
	fs.BoolVar(&f.json, "json", false, "print JSON")
	fs.BoolVar(&f.tls, "tls", false, "connect with TLS")
	fs.BoolVar(&f.insecure, "tls-insecure", false, "with --tls, do not verify the server certificate")
	fs.IntVar(&f.limit, "limit", 1000, "scan: maximum pairs")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline for the whole command")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if f.password == "" {
		f.password = os.Getenv("KEFIR_PASSWORD")
	}
	need := map[string][2]int{"get": {1, 1}, "put": {2, 2}, "del": {1, 1 << 20}, "cas": {3, 3}, "scan": {0, 2}, "status": {0, 0}}[cmd]
	if len(pos) < need[0] || len(pos) > need[1] {
		return usageError{fmt.Errorf("wrong number of arguments (see kefir --help)")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	if cmd == "status" {
		return runStatus(ctx, f, stdout)
	}
	var opts []client.Option
	if f.password != "" {
		opts = append(opts, client.WithPassword(f.password))
	}
	if f.tls {
		opts = append(opts, client.WithTLS(&tls.Config{InsecureSkipVerify: f.insecure}))
	}
	var copts []client.CallOption
	if f.consistency != "" {
		l, err := client.ParseConsistency(f.consistency)
		if err != nil {
			return usageError{err}
		}
		copts = append(copts, client.WithConsistency(l))
	}
	if f.durability != "" {
		d, err := client.ParseDurability(f.durability)
		if err != nil {
			return usageError{err}
		}
		copts = append(copts, client.WithDurability(d))
	}
	// One call through --addr, which forwards what it does not lead: slot
	// routing would cost a round trip for INFO cluster and the map's fetch
	// (and dial the leader's advertised address, which may not be reachable
	// from here) to save at most one forward.
	opts = append(opts, client.WithCluster(false))
	c, err := client.Dial(ctx, []string{f.addr}, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	out := func(human string, v any) error {
		if f.json {
			return json.NewEncoder(stdout).Encode(v)
		}
		_, err := fmt.Fprintln(stdout, human)
		return err
	}
	switch cmd {
	case "get":
		v, err := c.Get(ctx, pos[0], copts...)
		if errors.Is(err, client.ErrNotFound) {
			// Exit status 1 in both modes, so a script can test for the key
			// without parsing what was printed.
			if f.json {
				if err := out("", map[string]any{"key": pos[0], "found": false}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(stderr, "(not found)\n")
			}
			return exitStatus(1)
		}
		if err != nil {
			return err
		}
		return out(string(v), map[string]any{"key": pos[0], "found": true, "value": string(v)})
	case "put":
		if err := c.Put(ctx, pos[0], []byte(pos[1]), copts...); err != nil {
			return err
		}
		return out("OK", map[string]any{"ok": true})
	case "del":
		n := 0
		for _, k := range pos {
			ok, err := c.Delete(ctx, k, copts...)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return out(fmt.Sprintf("deleted %d", n), map[string]any{"deleted": n})
	case "cas":
		ok, err := c.CAS(ctx, pos[0], []byte(pos[1]), []byte(pos[2]), copts...)
		if err != nil {
			return err
		}
		human := "swapped"
		if !ok {
			human = "not swapped (current value differs or key missing)"
		}
		return out(human, map[string]any{"swapped": ok})
	case "scan":
		start, end := "", ""
		if len(pos) > 0 {
			start = pos[0]
		}
		if len(pos) > 1 {
			end = pos[1]
		}
		kvs, err := c.Scan(ctx, start, end, f.limit, copts...)
		if err != nil {
			return err
		}
		if f.json {
			type kv struct {
				Key   string `json:"key"`
				Value string `json:"value"`
			}
			list := make([]kv, 0, len(kvs))
			for _, p := range kvs {
				list = append(list, kv{p.Key, string(p.Value)})
			}
			return json.NewEncoder(stdout).Encode(list)
		}
		for _, p := range kvs {
			fmt.Fprintf(stdout, "%s\t%s\n", p.Key, p.Value)
		}
		return nil
	}
	return nil
}

// runStatus asks a node for INFO over RESP and prints its fields.
func runStatus(ctx context.Context, f cliFlags, stdout io.Writer) error {
	var d net.Dialer
	var nc net.Conn
	var err error
	if f.tls {
		td := tls.Dialer{NetDialer: &d, Config: &tls.Config{InsecureSkipVerify: f.insecure}}
		nc, err = td.DialContext(ctx, "tcp", f.addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", f.addr)
	}
	if err != nil {
		return fmt.Errorf("connect %s: %w", f.addr, err)
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	rd := resp.NewReader(nc, 0)
	var buf []byte
	if f.password != "" {
		buf = resp.AppendCommand(buf, []byte("AUTH"), []byte(f.password))
	}
	buf = resp.AppendCommand(buf, []byte("INFO"))
	if _, err := nc.Write(buf); err != nil {
		return err
	}
	if f.password != "" {
		v, err := rd.ReadValue()
		if err != nil {
			return err
		}
		if v.Kind == resp.Error {
			return fmt.Errorf("AUTH: %s", v.Str)
		}
	}
	v, err := rd.ReadValue()
	if err != nil {
		return fmt.Errorf("INFO: %w", err)
	}
	if v.Kind == resp.Error {
		return fmt.Errorf("INFO: %s", v.Str)
	}
	fields := map[string]string{}
	var order []string
	sc := bufio.NewScanner(strings.NewReader(string(v.Str)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			order = append(order, line)
			continue
		}
		k, val, ok := strings.Cut(line, ":")
		if ok {
			fields[k] = val
			order = append(order, k)
		}
	}
	if f.json {
		return json.NewEncoder(stdout).Encode(infoJSON(fields)) // encoding/json sorts map keys
	}
	for _, k := range order {
		if strings.HasPrefix(k, "#") {
			fmt.Fprintf(stdout, "%s\n", strings.TrimSpace(strings.TrimPrefix(k, "#")))
			continue
		}
		fmt.Fprintf(stdout, "  %-28s %s\n", k, fields[k])
	}
	return nil
}

// infoJSON gives INFO's fields their JSON types: a value that is a number
// (uptime_in_seconds:12, log_pos:4096) is a JSON number, so `kefir status
// --json | jq '.log_pos > 0'` compares numbers, not strings; everything else
// (role:leader, default_consistency:bounded(3), db0:keys=2,...) stays a string.
func infoJSON(fields map[string]string) map[string]any {
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		} else if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			out[k] = n
		} else if x, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(x, 0) && !math.IsNaN(x) {
			out[k] = x
		} else {
			out[k] = v
		}
	}
	return out
}
