package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// StatusJSON is /status's body.
type StatusJSON struct {
	NodeID        string         `json:"node_id"`
	PID           int            `json:"pid"` // kefir up tells its own node from another process on the port by it
	Role          string         `json:"role"`
	Version       string         `json:"version"`
	UptimeSeconds int64          `json:"uptime_seconds"` // whole seconds, like INFO's uptime_in_seconds
	ClientAddr    string         `json:"client_addr"`
	PeerAddr      string         `json:"peer_addr,omitempty"`
	Consistency   string         `json:"default_consistency"`
	Durability    string         `json:"default_durability"`
	Connections   int64          `json:"connections"`
	Commands      uint64         `json:"commands"`
	LastVersion   uint64         `json:"last_version"`
	LogPos        uint64         `json:"log_pos"`
	DurablePos    uint64         `json:"durable_pos"`
	Storage       map[string]any `json:"storage"`
	Shard         map[string]any `json:"shard"`
	// Replication is set on a replica of a VR group (at a node of several
	// groups: its first group's).
	Replication *ReplicaInfo `json:"replication,omitempty"`
	// Groups is set at a node of several groups (Config.Groups): the slot
	// map's groups and this node's replica of each (cluster.go).
	Groups []GroupStatus `json:"groups,omitempty"`
	// ClusterMap is the metadata group's map as this node follows it
	// (meta.go; with --groups).
	ClusterMap *MetaStatus `json:"cluster_map,omitempty"`
}

// Status returns the node's status as /status serves it.
func (s *Server) Status() StatusJSON {
	st := s.shard.Status()
	ds := s.db.Stats()
	failed := ""
	if ds.Failed != nil {
		failed = ds.Failed.Error()
	}
	out := StatusJSON{
		NodeID:        s.cfg.NodeID,
		PID:           os.Getpid(),
		Role:          s.roleName(),
		Replication:   s.replicaInfo(),
		Version:       Version,
		UptimeSeconds: int64(time.Since(s.started) / time.Second),
		ClientAddr:    s.ClientAddr().String(),
		Consistency:   s.cfg.Consistency.String(),
		Durability:    s.cfg.Durability.String(),
		Connections:   s.m.connected.Load(),
		Commands:      s.m.commands.Load(),
		LastVersion:   st.LastVersion,
		LogPos:        st.LastPos,
		DurablePos:    st.DurablePos,
		Storage: map[string]any{
			"keys": ds.Keys, "versions": ds.Versions, "segments": ds.Segments,
			"disk_bytes": ds.DiskBytes, "live_bytes": ds.LiveBytes, "appends": ds.Appends,
			"write_syscalls": ds.Writes, "fsyncs": ds.Syncs, "cache_hits": ds.CacheHits,
			"cache_misses": ds.CacheMisses, "compactions": ds.Compactions, "failed": failed,
		},
		Shard: map[string]any{
			"writes": st.Writes, "syncs": st.Syncs, "read_syncs": st.ReadSyncs,
			"deduplicated": st.Deduped, "client_table_entries": st.Clients,
		},
	}
	if a := s.PeerAddr(); a != nil {
		out.PeerAddr = a.String()
	}
	out.Groups = s.groupStatus()
	out.ClusterMap = s.metaStatus()
	return out
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	// Profiles are how performance work is done here (go tool pprof
	// http://HOST/debug/pprof/profile); the admin port is loopback or password-guarded.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Status())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if s.closing.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		if f := s.db.Stats().Failed; f != nil {
			http.Error(w, "storage failed: "+f.Error(), http.StatusServiceUnavailable)
			return
		}
		if ri := s.replicaInfo(); ri != nil && ri.Failed != "" {
			// A replica whose log write or fsync failed is out of the group.
			http.Error(w, "replica failed: "+ri.Failed, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("POST /chain/restart", s.chainRestart)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = statusPage.Execute(w, struct {
			StatusJSON
			Go string
		}{s.Status(), runtime.Version()})
	})
	if s.cfg.Password == "" {
		return mux
	}
	// With a password, everything but /healthz needs HTTP basic auth (any user name,
	// the client password), so exposing the admin port does not expose the data's
	// shape or profiles.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			mux.ServeHTTP(w, r)
			return
		}
		if !s.limiter.allow(r.RemoteAddr) {
			http.Error(w, "too many failed attempts", http.StatusTooManyRequests)
			return
		}
		_, pwd, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(pwd), []byte(s.cfg.Password)) != 1 {
			if ok {
				s.limiter.fail(r.RemoteAddr)
				s.m.authFails.Inc()
				s.log.Warn("HTTP admin: wrong password", "remote", r.RemoteAddr)
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="kefir"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		s.limiter.succeed(r.RemoteAddr)
		mux.ServeHTTP(w, r)
	})
}

var statusPage = template.Must(template.New("status").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Kefir {{.NodeID}}</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:50em}
td{padding:.2em 1em .2em 0}th{text-align:left;padding-top:1em}</style></head>
<body><h1>Kefir node {{.NodeID}}</h1>
<table>
<tr><td>role</td><td>{{.Role}}</td></tr>
<tr><td>pid</td><td>{{.PID}}</td></tr>
<tr><td>version</td><td>{{.Version}} ({{.Go}})</td></tr>
<tr><td>uptime</td><td>{{.UptimeSeconds}} s</td></tr>
<tr><td>client port (RESP)</td><td><code>{{.ClientAddr}}</code></td></tr>
<tr><td>defaults</td><td>consistency {{.Consistency}}, durability {{.Durability}}</td></tr>
<tr><td>connections</td><td>{{.Connections}}</td></tr>
<tr><td>commands</td><td>{{.Commands}}</td></tr>
<tr><td>last version</td><td>{{.LastVersion}}</td></tr>
<tr><td>log / durable position</td><td>{{.LogPos}} / {{.DurablePos}}</td></tr>
{{with .Replication}}<tr><th colspan=2>replication</th></tr>
<tr><td>replica / cluster</td><td>{{.ReplicaID}} / {{.ClusterID}}</td></tr>
<tr><td>status, view, leader</td><td>{{.Status}}, view {{.View}}, leader {{.Leader}}</td></tr>
<tr><td>view changes / leader changes / depositions</td><td>{{.ViewChanges}} / {{.LeaderChanges}} / {{.Depositions}}</td></tr>
<tr><td>writes refused (no leader)</td><td>{{.WritesRefusedNoLeader}}</td></tr>
</table>
<h2>Last view events</h2>
{{if .ViewEvents}}<table>
<tr><th>time (UTC)</th><th>event</th><th>view</th><th>leader</th><th>reason</th></tr>
{{range .ViewEvents}}<tr><td>{{.Time.Format "2006-01-02 15:04:05.000"}}</td><td>{{.Kind}}</td><td>{{.View}}</td><td>{{if .Leader}}{{.Leader}}{{end}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>{{else}}<p>none since this node started</p>{{end}}
<table>{{end}}
<tr><th colspan=2>storage</th></tr>
{{range $k, $v := .Storage}}<tr><td>{{$k}}</td><td>{{$v}}</td></tr>{{end}}
<tr><th colspan=2>shard</th></tr>
{{range $k, $v := .Shard}}<tr><td>{{$k}}</td><td>{{$v}}</td></tr>{{end}}
</table>
{{with .Groups}}<h2>Groups</h2>
<table>
<tr><th>group</th><th>slots</th><th>members</th><th>leader</th><th>here</th><th>lag (ops)</th><th>followers' lag (ops)</th></tr>
{{range .}}<tr><td>{{.ID}}</td><td>{{.SlotCount}}{{if .Slots}} ({{range $i, $r := .Slots}}{{if $i}}, {{end}}{{$r}}{{end}}){{end}}</td><td>{{range $i, $m := .Members}}{{if $i}}, {{end}}{{$m}}{{end}}</td><td>{{.Leader}}</td><td>{{.Role}}</td><td>{{if .Role}}{{.Lag}}{{end}}</td><td>{{range $i, $f := .Followers}}{{if $i}}, {{end}}{{$f.ID}}: {{$f.Lag}}{{end}}</td></tr>
{{end}}</table>{{end}}
<p><a href="/metrics">/metrics</a> · <a href="/status">/status</a> · <a href="/healthz">/healthz</a></p>
</body></html>
`))

// chainRestart is POST /chain/restart?without=N[,M][&group=G]: the operator
// restarts a chain that is down without members that may never come back
// (`kefir chain restart`; docs/chain.md) — the node's own chain (kefir
// server --engine chain), or with group the cluster's chain group G, whose
// masters run at the metadata group's nodes. Only the acting master does
// it: 503 at any other node (404 at a node hosting none), so the caller
// asks the next.
func (s *Server) chainRestart(w http.ResponseWriter, r *http.Request) {
	var ids []uint64
	for _, f := range strings.Split(r.URL.Query().Get("without"), ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || id == 0 {
			http.Error(w, "without: want member ids, N[,M...]", http.StatusBadRequest)
			return
		}
		ids = append(ids, id)
	}
	var cr cluster.ChainRestarter
	if g := r.URL.Query().Get("group"); g != "" {
		id, err := strconv.ParseUint(g, 10, 16)
		if err != nil || id == 0 {
			http.Error(w, "group: want a chain group's id", http.StatusBadRequest)
			return
		}
		m, ok := s.groupMaster(cluster.GroupID(id))
		if !ok {
			http.Error(w, fmt.Sprintf("this node runs no master of chain group %d (not a metadata member, or not a chain group of its map)", id), http.StatusNotFound)
			return
		}
		cr = m
	} else {
		var ok bool
		if cr, ok = s.grp.(cluster.ChainRestarter); !ok || s.grp == nil {
			msg := "not a chain node hosting a master"
			if s.multi != nil {
				msg += ": a chain group of a cluster is named by group=G (kefir chain restart --group G)"
			}
			http.Error(w, msg, http.StatusNotFound)
			return
		}
	}
	msg, err := cr.RestartChainWithout(ids)
	switch {
	case errors.Is(err, cluster.ErrNotActing):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case err != nil:
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		s.log.Warn("chain restarted without members by the operator", "without", ids, "outcome", msg)
		_, _ = w.Write([]byte(msg + "\n"))
	}
}
