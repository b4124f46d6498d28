package main

// --metrics: the counters of a mount's 9P client (remote.Stats) and of a
// server (its journal tree's stats file) as Prometheus samples, served by
// package metrics; those of FUSE views and coherence are in fusestats.go.

import (
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/metrics"
	"github.com/shalefs/shale/remote"
)

// endpoint is a running metrics server; nil when --metrics was not given.
type endpoint struct{ s *metrics.Server }

// serveMetrics listens on addr, if any, and serves src's samples.
func serveMetrics(addr string, src metrics.Source) (*endpoint, error) {
	if addr == "" {
		return nil, nil
	}
	s, err := metrics.Serve(addr, src)
	if err != nil {
		return nil, err
	}
	return &endpoint{s}, nil
}

// Addr is the address listened on.
func (e *endpoint) Addr() string { return e.s.Addr() }

// close stops the endpoint, if any.
func (e *endpoint) close(logger *slog.Logger) {
	if e == nil {
		return
	}
	if err := e.s.Close(); err != nil {
		logger.Warn("closing the metrics endpoint", "addr", e.s.Addr(), "err", err)
	}
}

// mountSource is a Source of the counters of a plan's views, of its
// stack's coherence manager and, with a 9p:// LOWER, of its 9P client:
// none until set, once the views are mounted.
type mountSource struct {
	p atomic.Pointer[plan]
}

func (m *mountSource) set(p *plan) { m.p.Store(p) }

func (m *mountSource) samples() []metrics.Sample {
	p := m.p.Load()
	if p == nil {
		return nil
	}
	var out []metrics.Sample
	if s, ok := remote.StatsOf(p.bottom); ok {
		out = clientSamples(s)
	}
	for _, mnt := range slices.Sorted(maps.Keys(p.counters)) {
		out = append(out, viewSamples(mnt, p.counters[mnt].Stats())...)
	}
	if p.manager != nil {
		out = append(out, coherenceSamples(p.manager.Stats())...)
	}
	return out
}

// clientSamples are a 9P client's counters as shale_client_* samples.
func clientSamples(s remote.Stats) []metrics.Sample {
	var out []metrics.Sample
	add := func(name, help string, gauge bool, labels map[string]string, v float64) {
		out = append(out, metrics.Sample{Name: "shale_client_" + name, Help: help, Gauge: gauge, Labels: labels, Value: v})
	}
	counter := func(name, help string, v uint64) { add(name, help, false, nil, float64(v)) }
	gauge := func(name, help string, v float64) { add(name, help, true, nil, v) }
	byLabel := func(name, help, label string, m map[string]uint64) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			add(name, help, false, map[string]string{label: k}, float64(m[k]))
		}
	}

	caching := 0.0
	if s.Caching {
		caching = 1
	}
	gauge("caching", "1 while the server's journal controller answers and the client caches, else 0.", caching)
	byLabel("requests_total", "9P requests sent, by type (journal reads apart).", "type", s.Requests)
	byLabel("cache_hits_total", "Requests answered from the client's cache, by kind.", "kind", s.Hits)
	byLabel("cache_misses_total", "Requests the cache could not answer, by kind.", "kind", s.Misses)
	counter("journal_records_total", "Journal records applied.", s.Records)
	counter("journal_resets_total", "Times the client dropped everything it cached.", s.Resets)
	counter("journal_reads_total", "Reads of the client's journal.", s.JournalReads)
	counter("journal_dropped_total", "QIDs told to the controller as no longer cached.", s.Dropped)
	counter("sent_bytes_total", "Bytes sent to the server, frames included.", s.BytesSent)
	counter("received_bytes_total", "Bytes received from the server, frames included.", s.BytesReceived)
	gauge("cached_files", "Files with data in the cache.", float64(s.CachedFiles))
	gauge("cached_bytes", "File data held in the cache, in memory or on disk.", float64(s.CachedBytes))

	sp := s.Sprite
	if sp == nil {
		return out
	}
	delay, _ := time.ParseDuration(sp.WriteDelay) // "off": 0, written through
	gauge("write_delay_seconds", "How long written data may stay on the client; 0: written through.", delay.Seconds())
	counter("read_bytes_total", "Bytes of file data programs read.", sp.ReadBytes)
	counter("read_server_bytes_total", "Bytes of file data read from the server.", sp.ReadServerBytes)
	counter("written_bytes_total", "Bytes of file data programs wrote.", sp.WriteBytes)
	counter("written_server_bytes_total", "Bytes of file data written to the server, back or through.", sp.WriteServerBytes)
	counter("discarded_bytes_total", "Delayed bytes never sent: overwritten, truncated or unlinked first.", sp.Discarded)
	counter("lost_bytes_total", "Delayed bytes the server refused (their reclaim was refused).", sp.Lost)
	gauge("dirty_bytes", "Written bytes not yet written back.", float64(sp.DirtyBytes))
	gauge("dirty_files", "Files with data not yet written back.", float64(sp.DirtyFiles))
	byLabel("writebacks_total", "Write-backs of delayed data, by reason.", "reason", sp.WriteBacks)
	counter("opens_total", "Opens answered by the server.", sp.Opens)
	counter("opens_stale_total", "Opens that found another version: the cached data was dropped.", sp.OpensStale)
	counter("opens_nocache_total", "Opens of a write-shared file: not cached.", sp.OpensNoCache)
	counter("recalls_total", "Recalls of delayed data answered.", sp.Recalls)
	counter("uncaches_total", "Uncache records answered.", sp.Uncaches)
	counter("cleans_total", "Cleans sent unasked: the client holds nothing dirty of the file, so no recall is needed.", sp.Cleans)
	counter("reclaims_refused_total", "Reclaims of delayed data the server refused after a reconnection.", sp.ReclaimsRefused)
	return out
}

// serverGauges are the lines of a server's stats file that are levels,
// not counts; skipped those that are neither.
var (
	serverGauges = map[string]bool{
		"connections": true, "journals": true, "journals.connected": true,
		"interest": true, "records.queued": true, "sprite.files": true,
		"connections.sessions": true, "connections.pending": true,
		"journals.bytes": true, "journals.bytes.abandoned": true,
	}
	serverSkipped = map[string]bool{
		"epoch":    true, // an identity, not a quantity
		"requests": true, // the sum of requests_total{type}
	}
)

// serverHelp describes the lines of the stats file (docs/network.md).
var serverHelp = map[string]string{
	"bytes.in":                  "Bytes of whole 9P messages read.",
	"bytes.out":                 "Bytes of whole 9P messages written.",
	"connections":               "Connections now.",
	"connections.sessions":      "Connections admitted to a session now.",
	"connections.pending":       "Connections before their first 9P message now.",
	"connections.reaped":        "Idle sessions closed to admit another.",
	"connections.refused":       "Connections refused a session (all busy).",
	"squash.refused":            "Requests of a client's root, acting as nobody (root squash), refused with EACCES or EPERM.",
	"journals.bytes":            "Estimated memory of all journals.",
	"journals.bytes.abandoned":  "Estimated memory of the journals without a connection.",
	"sprite.evictions":          "Clients that lost their caching of a file by failing a recall.",
	"journals":                  "Journals of caching clients.",
	"journals.connected":        "Journals with a connection now.",
	"interest":                  "QIDs followed, all journals.",
	"records.queued":            "Journal records waiting to be read, all journals.",
	"records.made":              "Journal records appended.",
	"records.sent":              "Journal records delivered in replies.",
	"resets":                    "Reset records made.",
	"sprite.files":              "Files whose open, version and dirty-data state Sprite's rules keep.",
	"sprite.opens":              "Opens of regular files.",
	"sprite.opens.write":        "Opens of regular files for writing.",
	"sprite.opens.recall":       "Opens that recalled delayed writes from other clients.",
	"sprite.opens.shared":       "Files made write-shared (not cached) by an open.",
	"sprite.opens.grace":        "Opens that waited for clients to reclaim after an unclean restart.",
	"sprite.recall.timeouts":    "Recalls given up on: the open went on without the client's delayed writes.",
	"sprite.writebacks":         "Opens that only write back a client's delayed data.",
	"sprite.writebacks.refused": "Write-backs and reclaims refused: they would undo another client's writes, or come from a client that failed a recall of the file (ESTALE), or name a file the client never held open for writing (EPERM).",
	"sprite.reclaims.unheld":    "Reclaims refused (EPERM): the client never held the file open for writing.",
}

// serverSamples turns the text of a server's stats file ("name value" a
// line, export/stats.go) into shale_server_* samples: requests.TYPE is
// requests_total{type="TYPE"}; other counters are NAME_total and gauges
// NAME, with '.' made '_'.
func serverSamples(text []byte) []metrics.Sample {
	var out []metrics.Sample
	vals, order := export.ParseStats(text)
	for _, name := range order {
		if serverSkipped[name] {
			continue
		}
		v := float64(vals[name])
		if typ, ok := strings.CutPrefix(name, "requests."); ok {
			out = append(out, metrics.Sample{Name: "shale_server_requests_total",
				Help: "9P requests read, by type.", Labels: map[string]string{"type": typ}, Value: v})
			continue
		}
		help := serverHelp[name]
		if help == "" {
			help = "The stats file's " + name + "."
		}
		s := metrics.Sample{Name: "shale_server_" + metricName(name), Help: help, Value: v}
		if serverGauges[name] {
			s.Gauge = true
		} else {
			s.Name += "_total"
		}
		out = append(out, s)
	}
	return out
}

// metricName is name with what a Prometheus name cannot hold made '_'.
func metricName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
}
