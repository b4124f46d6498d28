// Command report turns bench/volume/run.sh's raw results (lines of
// "rep<TAB>system<TAB>row<TAB>value" on stdin) into markdown: medians with
// their range, shale's speedup over each peer, and issue 24's targets with
// PASS or MISS. Values are numbers; "inf" is a change that never showed.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

type kind int

const (
	rate    kind = iota // operations or MiB per second: higher is better
	seconds             // lower is better
	count               // stale reads, misses: lower is better, 0 the goal
)

type row struct {
	name, unit string
	kind       kind
}

var rows = []row{
	{"md create", "ops/s", rate},
	{"md stat", "ops/s", rate},
	{"md list", "entries/s", rate},
	{"md remove", "ops/s", rate},
	{"md all", "ops/s", rate},
	{"seq write (close)", "MiB/s", rate},
	{"seq write (in S3)", "MiB/s", rate},
	{"seq read (cached)", "MiB/s", rate},
	{"seq read (from S3)", "MiB/s", rate},
	{"go build cold", "s", seconds},
	{"go build hot", "s", seconds},
	{"data shows (s)", "s", seconds},
	{"stale reads", "reads", count},
	{"data never shown", "rounds", count},
	{"name shows (s)", "s", seconds},
	{"stale lookups", "stats", count},
	{"name never shown", "rounds", count},
}

// Issue 24's targets.
const (
	mdOverS3fs   = 10.0 // metadata: at least 10x s3fs's rate
	mdOverRclone = 3.0  // and 3x rclone's
	seqOfRclone  = 0.90 // sequential: at least 90% of rclone's
	hotOfLocal   = 2.0  // hot build: within 2x the local loop view
)

type results map[string]map[string][]float64 // row -> system -> values

// add keeps value val of system sys's row (a number, or inf).
func (r results) add(sys, row, val string) {
	v, err := strconv.ParseFloat(val, 64)
	if err != nil || math.IsNaN(v) {
		return
	}
	if r[row] == nil {
		r[row] = map[string][]float64{}
	}
	r[row][sys] = append(r[row][sys], v)
}

func (r results) median(w, s string) (float64, bool) {
	v := slices.Clone(r[w][s])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

func main() {
	sysFlag := flag.String("systems", "shale,rclone,s3fs,local", "systems in column order")
	flag.Parse()
	systems := strings.Split(*sysFlag, ",")
	res := results{}
	for sc := bufio.NewScanner(os.Stdin); sc.Scan(); {
		if f := strings.Split(sc.Text(), "\t"); len(f) == 4 {
			res.add(f[1], f[2], f[3])
		}
	}
	medians(res, systems)
	speedups(res, systems)
	targets(res)
}

func medians(res results, systems []string) {
	fmt.Print("### Medians\n\nMedian of the runs, [min–max] in brackets; \"never\" is a change that did not show within -t.\n\n")
	line(append([]string{"row", "unit"}, systems...))
	line(slices.Repeat([]string{"---"}, len(systems)+2))
	for _, w := range rows {
		if res[w.name] == nil {
			continue
		}
		out := []string{w.name, w.unit}
		for _, s := range systems {
			m, ok := res.median(w.name, s)
			if !ok {
				out = append(out, "–")
				continue
			}
			v := slices.Sorted(slices.Values(res[w.name][s]))
			out = append(out, fmt.Sprintf("%s [%s–%s]", num(m), num(v[0]), num(v[len(v)-1])))
		}
		line(out)
	}
	fmt.Println()
}

// speedup is how many times better shale's median is than the peer's
// (above 1: shale better), for rates and times alike.
func speedup(res results, w row, peer string) (float64, bool) {
	a, ok1 := res.median(w.name, "shale")
	b, ok2 := res.median(w.name, peer)
	if !ok1 || !ok2 || a == 0 || b == 0 || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return 0, false
	}
	if w.kind == rate {
		return a / b, true
	}
	return b / a, true
}

func speedups(res results, systems []string) {
	var peers []string
	for _, s := range systems {
		if s != "shale" && s != "local" {
			peers = append(peers, s)
		}
	}
	if len(peers) == 0 {
		return
	}
	fmt.Print("### shale against its peers\n\nHow many times better shale's median is (rates: shale's over the peer's; times: the peer's over shale's). Above 1.00x shale is better.\n\n")
	line(append([]string{"row"}, peers...))
	line(slices.Repeat([]string{"---"}, len(peers)+1))
	for _, w := range rows {
		if res[w.name] == nil || w.kind == count {
			continue
		}
		out := []string{w.name}
		for _, p := range peers {
			if x, ok := speedup(res, w, p); ok {
				out = append(out, fmt.Sprintf("%.2fx", x))
			} else {
				out = append(out, "–")
			}
		}
		line(out)
	}
	fmt.Println()
}

func targets(res results) {
	fmt.Print("### Targets (issue 24)\n\n")
	line([]string{"target", "measured", "result"})
	line([]string{"---", "---", "---"})
	find := func(name string) row {
		for _, w := range rows {
			if w.name == name {
				return w
			}
		}
		panic(name)
	}
	ratio := func(what, name, peer string, want float64, pct bool) {
		x, ok := speedup(res, find(name), peer)
		if !ok {
			return
		}
		got := fmt.Sprintf("%.2fx", x)
		if pct {
			got = fmt.Sprintf("%.0f%%", 100*x)
		}
		line([]string{what, got, verdict(x >= want)})
	}
	for _, p := range []string{"create", "stat", "list", "remove", "all"} {
		ratio("md "+p+": ≥ 10x s3fs", "md "+p, "s3fs", mdOverS3fs, false)
		ratio("md "+p+": ≥ 3x rclone", "md "+p, "rclone", mdOverRclone, false)
	}
	for _, w := range []string{"seq write (close)", "seq write (in S3)", "seq read (cached)", "seq read (from S3)"} {
		ratio(w+": ≥ 90% of rclone", w, "rclone", seqOfRclone, true)
	}
	if hot, ok := res.median("go build hot", "shale"); ok {
		if local, ok := res.median("go build hot", "local"); ok && local > 0 {
			line([]string{"hot build ≤ 2x the local loop view", fmt.Sprintf("%.2fx", hot/local), verdict(hot/local <= hotOfLocal)})
		}
	}
	for _, w := range []string{"stale reads", "stale lookups"} {
		if v := res[w]["shale"]; len(v) > 0 {
			total := 0.0
			for _, x := range v {
				total += x
			}
			line([]string{w + " across two clients: 0 (shale)", num(total) + " in all runs", verdict(total == 0)})
		}
	}
	fmt.Println()
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func num(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "never"
	case v == math.Trunc(v) && math.Abs(v) < 1e6:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func line(cells []string) { fmt.Println("| " + strings.Join(cells, " | ") + " |") }
