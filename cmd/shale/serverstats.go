package main

// A server's statistics file ("name value" a line, docs/network.md) as
// tables like a client's, for people; scripts get JSON, or the file as
// it is.

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/shalefs/shale/export"
)

// printServerStats prints the statistics file b as tables. Lines it does
// not know (a newer server's) follow as they are.
func printServerStats(w io.Writer, b []byte) {
	v, order := export.ParseStats(b)
	used := map[string]bool{}
	get := func(name string) uint64 { used[name] = true; return v[name] }
	fmt.Fprintf(w, "connections  %d now (%d sessions), %d pending, %d reaped, %d refused\n",
		get("connections"), get("connections.sessions"), get("connections.pending"), get("connections.reaped"), get("connections.refused"))
	fmt.Fprintf(w, "bytes        %d in, %d out\n", get("bytes.in"), get("bytes.out"))
	if n := get("squash.refused"); n > 0 {
		fmt.Fprintf(w, "root squash  %d requests of clients' root refused (it acts as nobody: shale serve --no-root-squash)\n", n)
	}
	fmt.Fprintf(w, "journals     %d (%d connected), following %d files, %d bytes held (%d abandoned)\n",
		get("journals"), get("journals.connected"), get("interest"), get("journals.bytes"), get("journals.bytes.abandoned"))
	fmt.Fprintf(w, "records      %d made, %d queued, %d sent; %d resets; epoch %d\n",
		get("records.made"), get("records.queued"), get("records.sent"), get("resets"), get("epoch"))
	var types []string
	for _, k := range order {
		if t, ok := strings.CutPrefix(k, "requests."); ok {
			used[k] = true
			if v[k] > 0 {
				types = append(types, t)
			}
		}
	}
	// The busiest first, as one reads such a table.
	slices.SortStableFunc(types, func(a, b string) int { return cmp.Compare(v["requests."+b], v["requests."+a]) })
	fmt.Fprintf(w, "%-12s %10d\n", "requests", get("requests"))
	for _, t := range types {
		fmt.Fprintf(w, "  %-10s %10d %8s\n", t, v["requests."+t], percent(v["requests."+t], v["requests"]))
	}
	if _, ok := v["sprite.opens"]; ok {
		opens := get("sprite.opens")
		fmt.Fprintf(w, "\nSprite (%d files followed)\n", get("sprite.files"))
		fmt.Fprintf(w, "opens        %d\n", opens)
		for _, a := range []struct{ what, name string }{
			{"for writing", "sprite.opens.write"},
			{"recalled delayed writes", "sprite.opens.recall"},
			{"write-shared (not cached)", "sprite.opens.shared"},
			{"waited for reclaims (grace)", "sprite.opens.grace"},
		} {
			n := get(a.name)
			fmt.Fprintf(w, "  %-30s %10d %8s of opens\n", a.what, n, percent(n, opens))
		}
		fmt.Fprintf(w, "recalls      %d timed out\n", get("sprite.recall.timeouts"))
		fmt.Fprintf(w, "write-backs  %d, %d refused\n", get("sprite.writebacks"), get("sprite.writebacks.refused"))
		fmt.Fprintf(w, "evictions    %d; reclaims of writes not held %d\n", get("sprite.evictions"), get("sprite.reclaims.unheld"))
	}
	var rest []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		if !used[k] {
			rest = append(rest, fmt.Sprintf("%s %d", k, v[k]))
		}
	}
	if len(rest) > 0 {
		fmt.Fprintf(w, "\nother\n  %s\n", strings.Join(rest, "\n  "))
	}
}
