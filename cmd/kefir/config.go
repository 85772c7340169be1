package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// An option is one setting of `kefir server`. Each has one name, used as the flag
// (--name), the config file key (name, or name with '_' for '-') and the
// environment variable (KEFIR_NAME with '_' for '-'). Values are parsed from
// strings in every source, so the three sources cannot disagree on syntax.
type option struct {
	name  string
	def   string
	help  string
	apply func(cfg *serverConfig, v string) error
}

// serverConfig is server.Config plus the process-level settings.
type serverConfig struct {
	server.Config
	LogLevel  string
	LogFormat string
	// Engine is the replication engine of the node's group (vr or chain);
	// ChainMaster the chain's master (--engine chain).
	Engine      string
	ChainMaster server.Member
	// ChainStore is this chain member's datastore (--chain-store), and
	// ChainFlush a buffered or memory member's flush interval.
	ChainStore vrshard.ChainStore
	ChainFlush time.Duration
	// ChainNoLogMember: no member of the chain is a log
	// (--chain-log-member=false).
	ChainNoLogMember bool
	// ChainMode is the chain's update mode (--chain-mode), the same on
	// every member.
	ChainMode chain.Mode
	// PrecopyRate paces this member's pre-copy when it joins a chain
	// (--precopy-rate; 0: off).
	PrecopyRate int64
}

func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(strings.ToUpper(s))
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suf)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 512MiB, 1048576)", s)
	}
	return n * mult, nil
}

// parseByteLimit is parseBytes for a per-request size limit, which the RESP
// reader keeps as an int: 1 byte to 2 GiB.
func parseByteLimit(v string) (int, error) {
	n, err := parseBytes(v)
	if err == nil && (n <= 0 || n > 1<<31-1) {
		err = errors.New("must be between 1 and 2GiB")
	}
	return int(n), err
}

// parseAutoByteLimit is parseByteLimit, or 0 (the server's default for the
// deployment) for "auto".
func parseAutoByteLimit(v string) (int, error) {
	if v == "auto" {
		return 0, nil
	}
	return parseByteLimit(v)
}

var serverOptions = []option{
	{"node-id", "n1", "Name of this node in logs, INFO and /status.",
		func(c *serverConfig, v string) error { c.NodeID = v; return nil }},
	{"dir", "kefir-data/n1", "Data directory (created if missing).",
		func(c *serverConfig, v string) error { c.DataDir = v; return nil }},
	{"client-addr", "127.0.0.1:6380", "RESP listen address (redis-cli, redis-benchmark, the Go client). A non-loopback address requires --password.",
		func(c *serverConfig, v string) error { c.ClientAddr = v; return nil }},
	{"peer-addr", "127.0.0.1:7380", "Peer (replication) listen address; empty disables it. Peers must prove the --cluster-secret; a non-loopback address requires one.",
		func(c *serverConfig, v string) error { c.PeerAddr = v; return nil }},
	{"http-addr", "127.0.0.1:8380", "HTTP admin address (/metrics, /status, /healthz, /); empty disables it. A non-loopback address requires --password.",
		func(c *serverConfig, v string) error { c.HTTPAddr = v; return nil }},
	{"password", "", "Client password for AUTH and HELLO ... AUTH. Prefer KEFIR_PASSWORD or the config file over the flag (flags show in ps).",
		func(c *serverConfig, v string) error { c.Password = v; return nil }},
	{"cluster-secret", "", "Shared secret peers prove (HMAC challenge-response) on the peer port.",
		func(c *serverConfig, v string) error { c.ClusterSecret = v; return nil }},
	{"tls-cert", "", "PEM certificate file: with --tls-key, serve TLS on the client port.",
		func(c *serverConfig, v string) error { c.TLSCert = v; return nil }},
	{"tls-key", "", "PEM private key file for --tls-cert.",
		func(c *serverConfig, v string) error { c.TLSKey = v; return nil }},
	{"consistency", "linearizable", "Default read consistency for connections that set none: linearizable, cross-client-monotonic, session, bounded(N), bounded(DURATION), eventual.",
		func(c *serverConfig, v string) error {
			l, err := level.ParseConsistency(v)
			c.Consistency = l
			return err
		}},
	{"durability", "sync", "Default write durability: sync (fsync before the reply), cad (reply, fsync in the background; reads never see what a crash could take back), async (unsafe baseline).",
		func(c *serverConfig, v string) error {
			d, err := level.ParseDurability(v)
			c.Durability = d
			return err
		}},
	{"sync-interval", "1s", "Background fsync interval: bounds what async writes can lose (0 = only when needed).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.SyncInterval = d
			return err
		}},
	{"checkpoint-interval", "1m", "How often the storage engine writes its index hint file, so a restart replays only the log written since (negative = never).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.CheckpointInterval = d
			return err
		}},
	{"compact-interval", "1m", "How often the storage engine looks for segments to compact (reclaiming overwritten and deleted data; negative = never).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.CompactInterval = d
			return err
		}},
	{"retain-versions", "0", "Old versions of each key to keep for versioned and stale reads (0 = newest only).",
		func(c *serverConfig, v string) error {
			n, err := strconv.Atoi(v)
			if err == nil && n < 0 {
				return fmt.Errorf("must be >= 0")
			}
			c.RetainVersions = n
			return err
		}},
	{"cache-size", "32MiB", "Storage engine value cache size.",
		func(c *serverConfig, v string) error {
			n, err := parseBytes(v)
			c.CacheBytes = n
			return err
		}},
	{"max-clients", "10000", "Maximum concurrent client connections; more are refused with an error.",
		func(c *serverConfig, v string) error {
			n, err := strconv.Atoi(v)
			if err == nil && n <= 0 {
				err = errors.New("must be positive")
			}
			c.MaxClients = n
			return err
		}},
	{"idle-timeout", "0s", "Close client connections idle this long (0 = never).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.IdleTimeout = d
			return err
		}},
	{"max-bulk", "auto", "Largest bulk string accepted in a request, so the largest value. auto: 512MiB on a single node, 16MiB plus 64KiB in a replica group (what each carries: docs/operations.md). A command with a larger argument is read, discarded and answered with an error; the connection and its pipeline carry on.",
		func(c *serverConfig, v string) (err error) { c.MaxBulk, err = parseAutoByteLimit(v); return err }},
	{"max-request", "auto", "Largest command accepted on the RESP port, all its arguments together (an MSET of many values). auto: 64MiB, or --max-bulk plus 64KiB if that is more. A larger command is discarded and answered with an error, like one over --max-bulk. Bounds the memory one connection can make the node buffer.",
		func(c *serverConfig, v string) (err error) { c.MaxRequest, err = parseAutoByteLimit(v); return err }},
	{"shutdown-timeout", "10s", "On SIGTERM/SIGINT, how long to let connections finish before cutting them.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.ShutdownTimeout = d
			return err
		}},
	{"client-ttl", "1h", "How long the at-most-once table remembers an idle client id (KEFIR.CALL REQID); a retry older than this may execute again.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && d <= 0 {
				err = errors.New("must be positive")
			}
			c.ClientTTL = d
			return err
		}},
	{"members", "", "Replicated mode: the group's members in leader order, ID@PEER-ADDR/CLIENT-ADDR separated by commas, e.g. 1@127.0.0.1:7380/127.0.0.1:6380,2@127.0.0.1:7381/127.0.0.1:6381,3@127.0.0.1:7382/127.0.0.1:6382. Every member gets the same list; followers forward to (and name) the leader by its CLIENT-ADDR. Empty = a single node.",
		func(c *serverConfig, v string) error {
			ms, err := server.ParseMembers(v)
			c.Members = ms
			return err
		}},
	{"groups", "", "Cluster of several replica groups on a static slot map (docs/cluster.md): --members lists the cluster's nodes, and this the groups as ID=NODE,NODE,...:START-END[+START-END...] separated by ';' (nodes in leader order, slots 0-16383 each owned by one group), e.g. 1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383. The node hosts a replica of every group it is in. Every node gets the same list. Empty = one group, --members.",
		func(c *serverConfig, v string) error {
			gs, err := cluster.ParseGroups(v)
			c.Groups = gs
			return err
		}},
	{"chain-groups", "", "With --groups: the ids of the groups that run chain replication instead of VR, comma-separated (each group's nodes in --groups are the chain, head first, any number; its master runs at the metadata group's nodes; docs/chain.md). Every node gets the same list. Empty: every group is a VR group.",
		func(c *serverConfig, v string) error {
			c.ChainGroups = nil
			for _, f := range strings.Split(v, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				id, err := strconv.ParseUint(f, 10, 32)
				if err != nil || id == 0 {
					return fmt.Errorf("group %q is not a group id", f)
				}
				c.ChainGroups = append(c.ChainGroups, cluster.GroupID(id))
			}
			return nil
		}},
	{"cluster-redirects", "false", "With --groups: answer every request for a slot whose group another node leads with -MOVED <slot> <addr>, as Redis Cluster does (plain redis-cli then sees the redirect). Without it only connections that asked CLUSTER SLOTS/SHARDS/NODES or sent READONLY/READWRITE/ASKING are redirected, and the others are forwarded to the leader.",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.ClusterRedirects = b
			return err
		}},
	{"cross-group-tx", "true", "With --groups: KEFIR.TX transactions (and the Go client's Txn) may name keys of several slots, in several groups: this node coordinates their two-phase commit, and the leaders of the groups push transactions left prepared (docs/design/transactions.md, \"Cross-group transactions\"). On by default; false: -CROSSSLOT, as MULTI/EXEC always answers (give every node the same).",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.CrossGroupTx = b
			return err
		}},
	{"engine", "vr", "Replicated mode: the group's replication engine. vr: Viewstamped Replication (a leader, majorities). chain: chain replication (docs/chain.md): --members is the chain, head first; writes go to the head and are answered once every member logged them; membership is decided by the chain's master, hosted by a metadata group on the first three members by id (each keeps its replica in DATA-DIR/chain-meta; the group's leader's master acts), or with --chain-master by a separate kefir chain-master process. Give every member the same.",
		func(c *serverConfig, v string) error {
			switch v = strings.TrimSpace(v); v {
			case "vr", "chain":
				c.Engine = v
				return nil
			}
			return fmt.Errorf("want vr or chain, got %q", v)
		}},
	{"chain-master", "", "With --engine chain: a standalone, unreplicated master as ID@PEER-ADDR (a node id outside --members, running kefir chain-master) instead of the master hosted by the metadata group.",
		func(c *serverConfig, v string) error {
			if v = strings.TrimSpace(v); v == "" {
				c.ChainMaster = server.Member{}
				return nil
			}
			ms, err := server.ParseMembers(v + "/127.0.0.1:1")
			if err != nil || len(ms) != 1 {
				return fmt.Errorf("want ID@PEER-ADDR, got %q", v)
			}
			c.ChainMaster = server.Member{ID: ms[0].ID, PeerAddr: ms[0].PeerAddr}
			return nil
		}},
	{"chain-store", "log", "With --engine chain: this member's datastore (docs/chain.md, \"Datastores\"). log (d): its log is fsynced before it passes a write on or acknowledges it. buffered (b): its log is written at once and fsynced every --chain-flush, acknowledging without waiting (a crash of the process loses nothing, a power cut up to the interval). memory (m): its log and state live in memory only (a crash or restart of the process loses them; it rejoins empty). A chain may mix them; a sync write is durable once it is on every log member's disk, so a chain with no log member keeps nothing across a crash of every member.",
		func(c *serverConfig, v string) error {
			st, err := vrshard.ParseChainStore(v)
			c.ChainStore = st
			return err
		}},
	{"chain-log-member", "true", "With --engine chain (and a cluster's chain groups): some member of the chain is a log (--chain-store log), the same on every member. A sync write is then answered only once a log member's disk holds it — by a memory or buffered member too that never heard from one (a log member that failed before its first acknowledgement, a chain restarted from a memory or buffered member): it waits for a log member to join, or fails at the request timeout. false: the chain is memory and buffered members only, and a sync write is answered once every member's store holds it (docs/chain.md, \"Datastores\"). In a cluster of several groups it holds for every chain group the node hosts: true only if each of them has a log member. kefir up sets it from --chain-stores (a cluster of groups: true only if every node is a log).",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.ChainNoLogMember = !b
			return err
		}},
	{"chain-mode", "su", "With --engine chain: the chain's update mode, the same on every member (the master refuses a member that runs another; docs/chain.md, \"Update modes\"). su: a write is answered once every member holds it (each log member on its disk). ausi: once every member holds it in memory, no disk waited for (a power cut may take the last writes). au: an async write is answered by the head as soon as it has it (a crash of the head may take it); sync and cad writes once every member holds it; linearizable reads are refused.",
		func(c *serverConfig, v string) error {
			m, err := chain.ParseMode(v)
			c.ChainMode = m
			return err
		}},
	{"chain-version-query", "true", "With --engine chain (and a cluster's chain groups): a strong read of a key with a write in flight at this member asks the tail for its commit point and is answered here once this member applied that far (CRAQ's version query; docs/chain.md, \"Levels\"). false: such a read is forwarded whole to the tail. Either way the answer is linearizable; the query moves less data to and from the tail, the forward waits for no acknowledgement.",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.NoChainVersionQuery = !b
			return err
		}},
	{"chain-flush", "100ms", "With --engine chain and --chain-store buffered or memory: how often the member's log is fsynced (flushed).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && d <= 0 {
				err = fmt.Errorf("want a positive duration, got %q", v)
			}
			c.ChainFlush = d
			return err
		}},
	{"precopy-rate", "16MiB", "With --engine chain: how fast this member copies the chain's state when it joins (bytes a second of snapshot pages and log; 0: unpaced). The tail serves it the snapshot a page at a time as it asks; a lower rate leaves the tail, the joiner's disk and the box more for the chain's traffic and makes the join longer; a pace the chain's writes outrun is dropped for the rest of the copy, so the join still ends (docs/design/chain.md, \"Joins under load\").",
		func(c *serverConfig, v string) error {
			n, err := parseBytes(v)
			if err == nil && n < 0 {
				err = fmt.Errorf("want a size, got %q", v)
			}
			c.PrecopyRate = n
			if n == 0 {
				c.PrecopyRate = -1 // unpaced (vrshard: negative)
			}
			return err
		}},
	{"join", "", "Replicated mode: join a running group as a NEW member through any member's client address (HOST:PORT, or several comma-separated), with --replica-id, --peer-addr, --client-addr and an empty --dir, and no --members or --bootstrap. The node asks the group for its configuration and waits, logging, until it names --replica-id (kefir cluster replace-node --new ID@PEER-ADDR/CLIENT-ADDR, run before or after), then pulls the group's state. In a cluster of several groups (the seeds have a metadata map; no --groups here) it waits until the map names it in a group and joins every group the map names it in, now or later. Its --dir records the configuration: a restart needs no --join (docs/cluster.md, Replacing a failed node).",
		func(c *serverConfig, v string) error { c.Join = strings.TrimSpace(v); return nil }},
	{"replica-id", "0", "Replicated mode: this node's id in --members.",
		func(c *serverConfig, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			c.ReplicaID = n
			return err
		}},
	{"cluster-id", "0", "Replicated mode: the group's id, a positive number shared by every member; peers with another id (or another member list) are refused.",
		func(c *serverConfig, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			c.ClusterID = n
			return err
		}},
	{"bootstrap", "false", "Replicated mode: start a NEW group if this node's --dir holds no replication log. Give it to every member on the group's very first start only. Without it a node with an empty --dir is taken for one that lost its disk and rejoins by VR recovery; never pass it to a member that has been part of the group (it could vote with an empty log). kefir up decides this for you.",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.Bootstrap = b
			return err
		}},
	{"heartbeat", "10ms", "Replicated mode: leader heartbeat interval.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.HeartbeatInterval = d
			return err
		}},
	{"view-change-timeout", "300ms", "Replicated mode: a follower that hears nothing from the leader this long asks the others whether they lost it too; a view change starts once a majority has. At least the 250ms lease (a shorter timeout is refused, the lease is not shortened).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.ViewChangeTimeout = d
			return err
		}},
	{"nilext", "false", "Replicated mode, EXPERIMENTAL: the Skyros nilext fast path. Plain SET and MSET from RESP clients complete in one round trip: the receiving node sends them to every replica and answers on acks from f+ceil(f/2)+1 of them (the leader's included); the leader orders them in the background. Writes that miss those acks within 100ms fall back to the ordered path, exactly once. Give it to every member alike.",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.Nilext = b
			return err
		}},
	{"nilext-batch", "64", "With --nilext: the leader orders its pending nilext updates into the log as soon as this many wait (at least 1).",
		func(c *serverConfig, v string) error {
			n, err := strconv.Atoi(v)
			if err == nil && n < 1 {
				err = fmt.Errorf("must be at least 1, got %d", n)
			}
			c.NilextBatch = n
			return err
		}},
	{"nilext-interval", "1ms", "With --nilext: the leader orders whatever nilext updates wait at least this often. Longer: fewer ordering rounds at low load, more reads that must wait for pending updates to be ordered.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && d <= 0 {
				err = fmt.Errorf("must be positive, got %v", d)
			}
			c.NilextInterval = d
			return err
		}},
	{"nilext-sync-delay", "5ms", "With --nilext: how long a log batch no client waits for (updates ordered from the durability log, cad durability-log records) may wait for the next fsync to cover it, so each nilext write costs about one fsync per replica instead of two. 0: sync every batch at once. A cad nilext write can then be lost if every replica loses power within this delay plus one fsync (docs/design/nilext.md).",
		func(c *serverConfig, v string) (err error) {
			c.NilextSyncDelay, err = parseHoldDelay(v, 0)
			return err
		}},
	{"cad-sync-delay", "2ms", "Replicated mode: how long a log batch no client waits for (cad and async blind writes, acknowledged before they are durable) may wait for a later fsync to cover it, so a write-heavy cad load pays fewer fsyncs. A sync write, a read or a session that waits for such a batch syncs it at once. 0: sync every batch as soon as the previous fsync returns; at most 100ms. The price: acknowledged cad writes that no read has seen can be lost if every replica loses power within this delay plus one fsync (docs/design/cad.md §17).",
		func(c *serverConfig, v string) (err error) {
			// Longer holds would outlast the waits that rely on a prompt
			// commit (a follower's 50ms read wait, request timeouts).
			c.CadSyncDelay, err = parseHoldDelay(v, 100*time.Millisecond)
			return err
		}},
	{"replication-checkpoint-ops", "20000", "Replicated mode: take a checkpoint (sync the storage engine, start a new replication log segment holding the snapshot point, drop the older ones) after this many applied operations (or 64 MiB of log). Lower: a smaller log to replay on restart, more engine fsyncs.",
		func(c *serverConfig, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			if err == nil && n == 0 {
				err = errors.New("must be at least 1")
			}
			c.CheckpointOps = n
			return err
		}},
	{"fsync-extra-delay", "0", "Benchmarks only: sleep this long after every fsync of a file (engine and replication logs, their checkpoints and compactions), before the data counts as durable, to emulate a slower disk than this machine's — e.g. 1ms to 3ms for the SSDs of the CAD paper's experiments (docs/benchmarks.md). The real fsync still happens first, so nothing is reported durable that is not. 0: none; at most 100ms.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && (d < 0 || d > server.MaxFsyncExtraDelay) {
				err = fmt.Errorf("must be between 0 and %v, got %v", server.MaxFsyncExtraDelay, d)
			}
			c.FsyncExtraDelay = d
			return err
		}},
	{"active-expiry", "100ms", "How often the leader (a single node: the node) looks for expired keys and deletes them through the log (docs/design/expiry.md); negative = never (expired keys stay stored, hidden from reads, until written).",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			c.ActiveExpiry = d
			return err
		}},
	{"clock-skew", "100ms", "Replicated mode: the most any member's wall clock may be off the leader's. A follower decides key expiry at its clock plus this, so it never serves a key the leader's clock expired (docs/consistency.md, Key expiry). Keep clocks synchronized well within it; give every member the same.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && d < 0 {
				err = fmt.Errorf("must not be negative, got %v", d)
			}
			c.ClockSkew = d
			return err
		}},
	{"repair-after", cluster.DefaultRepairAfter.String(), "A cluster of several groups: the metadata group's leader re-creates, on live nodes of the map, the replicas of a node that has not answered for this long, as kefir cluster replace-node --old N would (docs/cluster.md, Automatic repair). Longer than a restart or an upgrade takes: a repair copies the node's data, and a node that comes back after it retires its replicas. 0 turns automatic repair off. Give every node the same.",
		func(c *serverConfig, v string) error {
			d, err := time.ParseDuration(v)
			if err == nil && d < 0 {
				err = fmt.Errorf("must not be negative, got %v", d)
			}
			c.RepairAfter = d
			return err
		}},
	{"zone", "", "A cluster of several groups: this node's failure domain (a rack, an availability zone; a short printable label without spaces or commas). The node records it in the cluster map once the map has the node, and placement (kefir cluster replace-node --old N alone, add-group and add-members without nodes named, automatic repair) puts a group's replicas in distinct zones (docs/cluster.md, Failure domains). Empty = no zone. Every node of the metadata group must run a build that knows zones first.",
		func(c *serverConfig, v string) error {
			c.Zone = v
			return kv.ValidZone(v)
		}},
	{"follower-reads", "false", "Replicated mode: followers serve cross-client-monotonic reads while they hold an active-set lease from the leader (docs/consistency.md); durable data is then applied on every active-set member before any read sees it. Without it those reads go to the leader. Give it to every member alike.",
		func(c *serverConfig, v string) error {
			b, err := strconv.ParseBool(v)
			c.FollowerReads = b
			return err
		}},
	{"io-model", string(server.DefaultIOModel()), "How client connections are served: epoll (a few event loops read every ready socket, run its pipelined commands and write the replies at once; Linux only) or goroutine (one goroutine per connection, Go's usual model). TLS connections always use goroutine. KEFIR_IO_LOOPS sets the number of event loops (default: one per two CPUs).",
		func(c *serverConfig, v string) error {
			m, err := server.ParseIOModel(strings.TrimSpace(v))
			if err != nil {
				return err
			}
			if m == server.IOEpoll && server.DefaultIOModel() != server.IOEpoll {
				return errors.New("epoll needs Linux; use goroutine")
			}
			c.IOModel = m
			return nil
		}},
	{"loop-spin", "auto", "How long an event loop polls for more commands before it sleeps, while it is busy (a closed-loop client's next command then finds it awake and pays no wake-up): a duration such as 50us, off, or auto (50us on a single node; off in a replica group, whose nodes usually share cores). Spends CPU only under load. See docs/operations.md.",
		func(c *serverConfig, v string) error {
			switch v = strings.TrimSpace(v); v {
			case "auto", "":
				c.LoopSpin = 0
				return nil
			case "off", "0":
				c.LoopSpin = -1
				return nil
			}
			d, err := time.ParseDuration(v)
			switch {
			case err != nil:
				return fmt.Errorf("want a duration, off or auto: %w", err)
			case d < 0:
				return fmt.Errorf("must not be negative, got %v", d)
			case d > 10*time.Millisecond:
				return fmt.Errorf("at most 10ms, got %v", d)
			}
			c.LoopSpin = d
			return nil
		}},
	{"log-level", "info", "Log level: debug, info, warn, error.",
		func(c *serverConfig, v string) error { c.LogLevel = v; return nil }},
	{"log-format", "text", "Log format: text or json.",
		func(c *serverConfig, v string) error { c.LogFormat = v; return nil }},
}

func envName(opt string) string {
	return "KEFIR_" + strings.ToUpper(strings.ReplaceAll(opt, "-", "_"))
}

func findOption(name string) *option {
	name = strings.ReplaceAll(strings.ToLower(name), "_", "-")
	for i := range serverOptions {
		if serverOptions[i].name == name {
			return &serverOptions[i]
		}
	}
	return nil
}

// loadServerConfig resolves the configuration: defaults, then the config file
// (--config or KEFIR_CONFIG), then KEFIR_* variables, then flags set on the
// command line; each later source overrides the earlier.
func loadServerConfig(args []string, env func(string) string, stderr io.Writer) (serverConfig, error) {
	fs := flag.NewFlagSet("kefir server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML config file (keys are the option names, e.g. client-addr = \"127.0.0.1:6380\"). Also KEFIR_CONFIG.")
	flagVals := map[string]*string{}
	for _, o := range serverOptions {
		flagVals[o.name] = fs.String(o.name, o.def, fmt.Sprintf("%s (env %s)", o.help, envName(o.name)))
	}
	fs.Usage = func() { serverUsage(fs, stderr) }
	if err := fs.Parse(args); err != nil {
		return serverConfig{}, err
	}
	if fs.NArg() > 0 {
		return serverConfig{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var cfg serverConfig
	for _, o := range serverOptions {
		if err := o.apply(&cfg, o.def); err != nil {
			panic(fmt.Sprintf("default of %s: %v", o.name, err))
		}
	}
	path := *configPath
	if path == "" {
		path = env("KEFIR_CONFIG")
	}
	if path != "" {
		var file map[string]any
		if _, err := toml.DecodeFile(path, &file); err != nil {
			return cfg, fmt.Errorf("config file %s: %w", path, err)
		}
		keys := make([]string, 0, len(file))
		for k := range file {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			o := findOption(k)
			if o == nil {
				return cfg, fmt.Errorf("config file %s: unknown option %q (see kefir server --help)", path, k)
			}
			if err := o.apply(&cfg, fmt.Sprint(file[k])); err != nil {
				return cfg, fmt.Errorf("config file %s: %s: %w", path, k, err)
			}
		}
	}
	for _, o := range serverOptions {
		if v := env(envName(o.name)); v != "" {
			if err := o.apply(&cfg, v); err != nil {
				return cfg, fmt.Errorf("%s: %w", envName(o.name), err)
			}
		}
	}
	// KEFIR_IO_LOOPS (docs/operations.md) is an environment-only setting with
	// no flag: read once here, like every other option, and handed to the
	// server as Config.IOLoops. A value that is not a positive number is
	// ignored (the default: one loop per two processors), as it always was.
	if n, err := strconv.Atoi(strings.TrimSpace(env("KEFIR_IO_LOOPS"))); err == nil && n > 0 {
		cfg.IOLoops = n
	}
	var ferr error
	fs.Visit(func(f *flag.Flag) {
		if o := findOption(f.Name); o != nil && ferr == nil {
			if err := o.apply(&cfg, *flagVals[o.name]); err != nil {
				ferr = fmt.Errorf("--%s: %w", o.name, err)
			}
		}
	})
	return cfg, ferr
}

func serverUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, `Usage: kefir server [options]

Runs one Kefir node: a RESP client port (any Redis client works), a peer port for
replication and an HTTP admin port. Every port binds to 127.0.0.1 unless told
otherwise; binding any other address requires a password (client/HTTP) or a
cluster secret (peer), and the node refuses to start without one.

Settings come from, in increasing precedence: built-in defaults, a TOML config file
(--config FILE or KEFIR_CONFIG), environment variables KEFIR_<OPTION> (upper case,
'-' as '_'), and command-line flags.

Options:
`)
	fmt.Fprintf(w, "  --config FILE\n        TOML config file; keys are option names, e.g. durability = \"cad\". Also KEFIR_CONFIG.\n")
	for _, o := range serverOptions {
		def := o.def
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(w, "  --%s VALUE   (env %s, default %s)\n        %s\n", o.name, envName(o.name), def, o.help)
	}
	fmt.Fprintf(w, "\nSignals: SIGTERM or SIGINT shuts down gracefully (stop accepting, finish in-flight\ncommands, fsync, close); a second signal exits at once.\n")
}

// parseHoldDelay parses a group-commit hold (--nilext-sync-delay,
// --cad-sync-delay): not negative, at most limit (0: no limit); 0 means no
// holding, which vrshard spells as a negative delay.
func parseHoldDelay(v string, limit time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
	case d < 0:
		err = fmt.Errorf("must not be negative, got %v", d)
	case limit > 0 && d > limit:
		err = fmt.Errorf("must be at most %v, got %v", limit, d)
	case d == 0:
		d = -1
	}
	return d, err
}
