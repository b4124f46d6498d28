package main

// The counters of a mount's FUSE views (fuseview.Stats) and of its
// stack's coherence manager (coherence.Stats): shale stats prints them,
// --metrics serves them as shale_fuse_* and shale_coherence_* samples.

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shalefs/shale/coherence"
	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/metrics"
)

// printFuse prints the requests of a view's kernel, busiest first, what
// it was told to keep and drop, and the stack's coherence callbacks.
func printFuse(w io.Writer, s *fuseview.Stats, c *coherence.Stats) {
	ops := slices.Collect(maps.Keys(s.Requests))
	slices.SortFunc(ops, func(a, b string) int {
		return cmp.Or(cmp.Compare(s.Requests[b].Count, s.Requests[a].Count), strings.Compare(a, b))
	})
	var total uint64
	for _, o := range ops {
		total += s.Requests[o].Count
	}
	fmt.Fprintf(w, "%-16s %10s %8s %10s\n", "FUSE requests", "count", "errors", "mean")
	for _, o := range ops {
		r := s.Requests[o]
		mean := time.Duration(r.Nanos / r.Count).Round(100 * time.Nanosecond)
		fmt.Fprintf(w, "  %-14s %10d %8d %10s\n", o, r.Count, r.Errors, mean)
	}
	fmt.Fprintf(w, "  %-14s %10d\n", "all", total)
	fmt.Fprintf(w, "lookups          %d, %d of no such name: %d kept missing by the kernel, %d of those dropped by a change since\n",
		s.Requests["LOOKUP"].Count, s.Missing, s.NegativeKept, s.NegativeDropped)
	fmt.Fprintf(w, "callbacks        %d events to this view; dropped from the kernel: %s\n", s.Callbacks, counts(s.Invalidations, []string{"pages", "attrs", "entry", "all"}))
	if c != nil {
		var n uint64
		for _, v := range c.Events {
			n += v
		}
		fmt.Fprintf(w, "coherence        %d changes (%s), %d of them not made through a view (noticed in LOWER, or told by the server); %d callbacks to views and exports\n",
			n, counts(c.Events, []string{"attrs", "data", "entries", "everything"}), c.Beside, c.Callbacks)
	}
}

// counts is m's values in the order of keys: "pages 3, attrs 0".
func counts(m map[string]uint64, keys []string) string {
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// viewSamples are a view's counters as shale_fuse_* samples, labelled
// with its mountpoint.
func viewSamples(mnt string, s fuseview.Stats) []metrics.Sample {
	var out []metrics.Sample
	add := func(name, help string, labels map[string]string, v float64) {
		l := map[string]string{"mountpoint": mnt}
		maps.Copy(l, labels)
		out = append(out, metrics.Sample{Name: "shale_fuse_" + name, Help: help, Labels: l, Value: v})
	}
	for _, o := range slices.Sorted(maps.Keys(s.Requests)) {
		r, op := s.Requests[o], map[string]string{"op": o}
		add("requests_total", "FUSE requests answered, by opcode.", op, float64(r.Count))
		add("request_errors_total", "FUSE requests answered with an error, by opcode.", op, float64(r.Errors))
		add("request_seconds_total", "Time spent answering FUSE requests, by opcode.", op, float64(r.Nanos)/1e9)
	}
	add("lookups_missing_total", "LOOKUPs that found no such name.", nil, float64(s.Missing))
	add("negative_kept_total", "Names found missing that the kernel may keep as missing.", nil, float64(s.NegativeKept))
	add("negative_dropped_total", "Kept missing names whose entry a change dropped.", nil, float64(s.NegativeDropped))
	add("callbacks_total", "Coherence events given to the view.", nil, float64(s.Callbacks))
	for _, k := range slices.Sorted(maps.Keys(s.Invalidations)) {
		add("invalidations_total", "Notifications that dropped the kernel's caches, by what they dropped.", map[string]string{"kind": k}, float64(s.Invalidations[k]))
	}
	return out
}

// coherenceSamples are a stack's coherence counters as shale_coherence_*
// samples.
func coherenceSamples(c coherence.Stats) []metrics.Sample {
	out := []metrics.Sample{
		{Name: "shale_coherence_beside_total", Help: "Changes made beside the stack: by other programs in LOWER, or by other clients of the 9P server.", Value: float64(c.Beside)},
		{Name: "shale_coherence_callbacks_total", Help: "Holders (views, the 9P export) called back to drop what they hold.", Value: float64(c.Callbacks)},
	}
	for _, k := range slices.Sorted(maps.Keys(c.Events)) {
		out = append(out, metrics.Sample{Name: "shale_coherence_events_total", Help: "Changes the stack made or noticed, by kind.",
			Labels: map[string]string{"kind": k}, Value: float64(c.Events[k])})
	}
	return out
}
