// Command report turns the raw results of bench/core/run.sh (lines of
// "rep<TAB>system<TAB>workload<TAB>value" on stdin) into markdown tables:
// medians, ratios against native and against shale's peers, and the
// targets with PASS or MISS.
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
	{"daemon CPU during seq read", info, false, false},
}

var names = map[string]string{
	"native":     "native ext4",
	"shale":      "shale",
	"shale-nopt": "shale (no passthrough)",
	"loopback":   "go-fuse loopback",
	"bindfs":     "bindfs",
}

const (
	metaTarget = 1.5
	seqTarget  = 0.95
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
	sysFlag := flag.String("systems", "native,shale,shale-nopt,loopback,bindfs", "systems in column order")
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
		if s != "shale" && s != "native" {
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

	// Targets.
	if has["shale"] {
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
			for _, p := range []string{"loopback", "bindfs"} {
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
