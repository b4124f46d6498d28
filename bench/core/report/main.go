// Command report turns the raw results of bench/core/run.sh (lines of
// "rep<TAB>system<TAB>workload<TAB>value" on stdin) into markdown tables:
// medians, ratios against native and against shale's peers, and the
// targets with PASS or MISS; with the layer systems in the run, also crypt
// against gocryptfs and rot13 against the loop view, with their targets.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

type kind int

const (
	seconds kind = iota // lower is better
	mbps                // higher is better
	iops                // higher is better
	info                // no better or worse
)

type workload struct {
	name string
	kind kind
	meta bool // a metadata workload: target within 1.5x of native
	seq  bool // a sequential workload: target at least 95% of native
}

var workloads = []workload{
	{"cp -a", seconds, true, false},
	{"find (cold)", seconds, true, false},
	{"find (warm)", seconds, true, false},
	{"find|xargs grep (cold)", seconds, true, false},
	{"grep -r (cold)", seconds, true, false},
	{"grep -r (warm)", seconds, true, false},
	{"rm -r", seconds, true, false},
	{"seq write 1 GiB", mbps, false, true},
	{"seq read 1 GiB", mbps, false, true},
	{"randread 4 KiB", iops, false, false},
	{"randwrite 4 KiB", iops, false, false},
	{"daemon CPU during seq write", info, false, false},
	{"daemon CPU during seq read", info, false, false},
}

var names = map[string]string{
	"native":         "native ext4",
	"shale":          "shale",
	"shale-nopt":     "shale (no passthrough)",
	"loopback":       "go-fuse loopback",
	"bindfs":         "bindfs",
	"passthrough_ll": "libfuse passthrough_ll",
	"rot13":          "shale rot13",
	"crypt":          "shale crypt",
	"crypt-noholes":  "shale crypt --no-holes",
	"crypt-base":     "shale crypt (base build)",
	"gocryptfs":      "gocryptfs",
}

// corePeers are the file systems the loop view is measured against.
var corePeers = map[string]bool{"shale-nopt": true, "loopback": true, "bindfs": true, "passthrough_ll": true}

const (
	metaTarget = 1.5
	seqTarget  = 0.95
	// crypt against gocryptfs: speedup at least cryptSeqTarget on the
	// sequential rows, at least cryptTarget on every other row.
	cryptSeqTarget = 1.2
	cryptTarget    = 1.0
	// A change to crypt, against the build before it (crypt-base): it
	// may cost at most 5% on any row.
	changeTarget = 0.95
	// rot13 within 10% of the loop view: at most 1.10x its time, at least
	// 90% of its throughput.
	rot13Slack = 0.10
)

func unit(k kind) string {
	switch k {
	case seconds:
		return "s"
	case mbps:
		return "MiB/s"
	case iops:
		return "IOPS"
	}
	return "CPU s"
}

func main() {
	sysFlag := flag.String("systems", "native,shale,shale-nopt,loopback,bindfs,passthrough_ll", "systems in column order")
	flag.Parse()
	systems := strings.Split(*sysFlag, ",")

	vals := map[string]map[string][]float64{} // workload -> system -> values
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			continue
		}
		v, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "report: bad value in %q\n", sc.Text())
			continue
		}
		if vals[f[2]] == nil {
			vals[f[2]] = map[string][]float64{}
		}
		vals[f[2]][f[1]] = append(vals[f[2]][f[1]], v)
	}
	med := func(w, s string) (float64, bool) {
		v := vals[w][s]
		if len(v) == 0 {
			return 0, false
		}
		v = append([]float64(nil), v...)
		sort.Float64s(v)
		if len(v)%2 == 1 {
			return v[len(v)/2], true
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
	}
	has := map[string]bool{}
	for _, s := range systems {
		has[s] = true
	}

	// Medians, with the range of the runs.
	fmt.Println("### Medians")
	fmt.Println()
	fmt.Println("Median of the runs, [min–max] in brackets. Times in seconds (lower is better); MiB/s and IOPS higher is better.")
	fmt.Println()
	header(append([]string{"workload", "unit"}, display(systems)...))
	for _, w := range workloads {
		if vals[w.name] == nil {
			continue
		}
		row := []string{w.name, unit(w.kind)}
		for _, s := range systems {
			m, ok := med(w.name, s)
			if !ok {
				row = append(row, "–")
				continue
			}
			v := append([]float64(nil), vals[w.name][s]...)
			sort.Float64s(v)
			row = append(row, fmt.Sprintf("%s [%s–%s]", num(m), num(v[0]), num(v[len(v)-1])))
		}
		line(row)
	}
	fmt.Println()

	// Against native.
	if has["native"] {
		fmt.Println("### Against native")
		fmt.Println()
		fmt.Println("Times as a multiple of native's (1.00x = as fast, higher is slower); throughput as a share of native's (100% = as fast, lower is slower).")
		fmt.Println()
		var others []string
		for _, s := range systems {
			if s != "native" {
				others = append(others, s)
			}
		}
		header(append([]string{"workload"}, display(others)...))
		for _, w := range workloads {
			if vals[w.name] == nil || w.kind == info {
				continue
			}
			n, ok := med(w.name, "native")
			row := []string{w.name}
			for _, s := range others {
				m, ok2 := med(w.name, s)
				switch {
				case !ok || !ok2 || n == 0 || m == 0:
					row = append(row, "–")
				case w.kind == seconds:
					row = append(row, fmt.Sprintf("%.2fx", m/n))
				default:
					row = append(row, fmt.Sprintf("%.0f%%", 100*m/n))
				}
			}
			line(row)
		}
		fmt.Println()
	}

	// shale against each peer.
	peers := []string{}
	for _, s := range systems {
		if corePeers[s] {
			peers = append(peers, s)
		}
	}
	if has["shale"] && len(peers) > 0 {
		fmt.Println("### shale against its peers")
		fmt.Println()
		fmt.Println("Speedup of shale over each peer: >1.00 means shale is faster (peer time / shale time, or shale throughput / peer throughput).")
		fmt.Println()
		header(append([]string{"workload"}, display(peers)...))
		for _, w := range workloads {
			if vals[w.name] == nil || w.kind == info {
				continue
			}
			sh, ok := med(w.name, "shale")
			row := []string{w.name}
			for _, p := range peers {
				m, ok2 := med(w.name, p)
				if !ok || !ok2 || sh == 0 || m == 0 {
					row = append(row, "–")
					continue
				}
				row = append(row, fmt.Sprintf("%.2f", speedup(w.kind, sh, m)))
			}
			line(row)
		}
		fmt.Println()
	}

	// Targets. The loop view's are left out of a run that is only about
	// the layers (no go-fuse loopback or bindfs, but rot13, crypt or
	// gocryptfs).
	layerRun := has["rot13"] || has["crypt"] || has["crypt-noholes"] || has["crypt-base"] || has["gocryptfs"]
	if has["shale"] && (!layerRun || has["loopback"] || has["bindfs"] || has["passthrough_ll"]) {
		fmt.Println("### Targets")
		fmt.Println()
		header([]string{"target", "workload", "measured", "result"})
		pass, miss := 0, 0
		verdict := func(ok bool) string {
			if ok {
				pass++
				return "PASS"
			}
			miss++
			return "**MISS**"
		}
		for _, w := range workloads {
			sh, ok := med(w.name, "shale")
			if !ok || w.kind == info {
				continue
			}
			if n, ok := med(w.name, "native"); ok && n > 0 {
				switch {
				case w.seq:
					r := sh / n
					line([]string{fmt.Sprintf("≥ %.0f%% of native", 100*seqTarget), w.name, fmt.Sprintf("%.0f%%", 100*r), verdict(r >= seqTarget)})
				case w.meta:
					r := sh / n
					line([]string{fmt.Sprintf("≤ %.1fx native time", metaTarget), w.name, fmt.Sprintf("%.2fx", r), verdict(r <= metaTarget)})
				}
			}
			for _, p := range []string{"loopback", "bindfs", "passthrough_ll"} {
				if m, ok := med(w.name, p); ok && m > 0 && sh > 0 {
					r := speedup(w.kind, sh, m)
					line([]string{"faster than " + names[p], w.name, fmt.Sprintf("%.2f", r), verdict(r > 1)})
				}
			}
		}
		fmt.Println()
		fmt.Printf("Targets: %d PASS, %d MISS.\n", pass, miss)
		fmt.Println()
	}

	layers(has, med, vals)

	// Passthrough.
	if pt, ok := med("daemon CPU during seq read", "shale"); ok {
		fmt.Printf("FUSE passthrough: the shale daemon used %.2f s of CPU during the 1 GiB read", pt)
		if nopt, ok := med("daemon CPU during seq read", "shale-nopt"); ok {
			fmt.Printf(", %.2f s with --no-passthrough", nopt)
			if pt < 0.05 || pt < nopt/5 {
				fmt.Printf(": passthrough was active.\n")
			} else {
				fmt.Printf(": passthrough was NOT active.\n")
			}
		} else {
			fmt.Println(".")
		}
	}
}

// speedup is how many times better shale's median is than a peer's.
func speedup(k kind, shale, peer float64) float64 {
	if k == seconds {
		return peer / shale
	}
	return shale / peer
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func display(systems []string) []string {
	var out []string
	for _, s := range systems {
		if n, ok := names[s]; ok {
			out = append(out, n)
		} else {
			out = append(out, s)
		}
	}
	return out
}

func header(cols []string) {
	line(cols)
	seps := make([]string, len(cols))
	for i := range seps {
		seps[i] = "---"
	}
	line(seps)
}

func line(cols []string) { fmt.Println("| " + strings.Join(cols, " | ") + " |") }

// layers prints crypt against gocryptfs and rot13 against the loop view
// (with and without passthrough), then their targets.
func layers(has map[string]bool, med func(w, s string) (float64, bool), vals map[string]map[string][]float64) {
	type cmp struct{ sys, base string }
	var cmps []cmp
	if has["crypt"] && has["gocryptfs"] {
		cmps = append(cmps, cmp{"crypt", "gocryptfs"})
	}
	if has["crypt"] && has["crypt-base"] {
		cmps = append(cmps, cmp{"crypt", "crypt-base"})
	}
	if has["crypt-noholes"] && has["crypt"] {
		cmps = append(cmps, cmp{"crypt-noholes", "crypt"})
	}
	for _, b := range []string{"shale-nopt", "shale"} {
		if has["rot13"] && has[b] {
			cmps = append(cmps, cmp{"rot13", b})
		}
	}
	if len(cmps) == 0 {
		return
	}
	fmt.Println("### Layers against their baselines")
	fmt.Println()
	fmt.Println("Speedup of each layer over its baseline: >1.00 means the layer is faster (baseline time / layer time, or layer throughput / baseline throughput).")
	fmt.Println()
	cols := []string{"workload"}
	for _, c := range cmps {
		cols = append(cols, names[c.sys]+" vs "+names[c.base])
	}
	header(cols)
	for _, w := range workloads {
		if vals[w.name] == nil || w.kind == info {
			continue
		}
		row := []string{w.name}
		for _, c := range cmps {
			a, ok := med(w.name, c.sys)
			b, ok2 := med(w.name, c.base)
			if !ok || !ok2 || a == 0 || b == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, fmt.Sprintf("%.2f", speedup(w.kind, a, b)))
		}
		line(row)
	}
	fmt.Println()

	fmt.Println("### Layer targets")
	fmt.Println()
	fmt.Printf("crypt: at least %.1fx gocryptfs's speed on sequential write and read, at least %.1fx on every other row. rot13: within %.0f%% of the loop view (at most %.2fx its time, at least %.0f%% of its throughput); the target is judged against the loop view without passthrough (a layer that changes file data cannot use passthrough); the rows against the loop view with passthrough are for reference and counted apart.\n",
		cryptSeqTarget, cryptTarget, 100*rot13Slack, 1+rot13Slack, 100*(1-rot13Slack))
	fmt.Println()
	header([]string{"target", "workload", "measured", "result"})
	type tally struct{ pass, miss int }
	counts := map[string]*tally{}
	verdict := func(group string, ok bool) string {
		t := counts[group]
		if t == nil {
			t = &tally{}
			counts[group] = t
		}
		if ok {
			t.pass++
			return "PASS"
		}
		t.miss++
		return "**MISS**"
	}
	for _, c := range cmps {
		for _, w := range workloads {
			if w.kind == info {
				continue
			}
			a, ok := med(w.name, c.sys)
			b, ok2 := med(w.name, c.base)
			if !ok || !ok2 || a == 0 || b == 0 {
				continue
			}
			r := speedup(w.kind, a, b)
			switch {
			case c.sys == "crypt" && c.base == "crypt-base":
				line([]string{fmt.Sprintf("crypt ≥ %.2fx its base build", changeTarget), w.name, fmt.Sprintf("%.2fx", r), verdict("crypt against its base build", r >= changeTarget-1e-9)})
			case c.sys == "crypt":
				want := cryptTarget
				if w.seq {
					want = cryptSeqTarget
				}
				line([]string{fmt.Sprintf("crypt ≥ %.1fx gocryptfs", want), w.name, fmt.Sprintf("%.2fx", r), verdict("crypt against gocryptfs", r >= want-1e-9)})
			case c.sys == "rot13":
				group, label := "rot13 against the loop view without passthrough", "rot13 within 10% of loop view (no passthrough)"
				if c.base == "shale" {
					group = "rot13 against the loop view with passthrough (reference)"
					label = "rot13 within 10% of loop view (passthrough; reference)"
				}
				var measured string
				var ok bool
				if w.kind == seconds {
					measured = fmt.Sprintf("%.2fx time", a/b)
					ok = a/b <= 1+rot13Slack+1e-9
				} else {
					measured = fmt.Sprintf("%.0f%%", 100*a/b)
					ok = a/b >= 1-rot13Slack-1e-9
				}
				line([]string{label, w.name, measured, verdict(group, ok)})
			}
		}
	}
	fmt.Println()
	for _, g := range []string{"crypt against gocryptfs", "crypt against its base build", "rot13 against the loop view without passthrough", "rot13 against the loop view with passthrough (reference)"} {
		if t := counts[g]; t != nil {
			fmt.Printf("Targets, %s: %d PASS, %d MISS.\n", g, t.pass, t.miss)
			fmt.Println()
		}
	}
}
