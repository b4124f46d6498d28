// Command report turns the raw results of bench/net/run.sh (lines of
// "rep<TAB>row<TAB>workload<TAB>seconds|timeout|failed<TAB>requests|-" on
// stdin) into markdown tables: median times, their ratios to the loop
// view's, and the 9P requests each step sent. With -cache, those of
// bench/net/cache.sh (cache.go); with -sprite, those of bench/net/sprite.sh
// (sprite.go). With -base REV as well, only the comparison of each network
// row with its twin on REV's build (base.go).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

var workloads = []string{
	"cp -a", "find (cold)", "find (warm)", "grep -r (cold)", "grep -r (warm)",
	"rm -r", "seq write", "seq read",
}

// A run that timed out or failed counts as infinitely slow, so the median
// says whether most runs finished.
var (
	timedOut = math.Inf(1)
	failed   = math.NaN()
)

type key struct{ row, workload string }

type sample struct {
	secs     float64
	requests float64 // NaN: no relay on this row
}

func main() {
	rowsFlag := flag.String("rows", "", "the rows, comma-separated, in order")
	mib := flag.Int("mib", 1024, "sequential file size in MiB")
	limit := flag.Int("timeout", 0, "the step timeout in seconds")
	cacheMode := flag.Bool("cache", false, "the results are bench/net/cache.sh's (rows local and SYSTEM-RTTms)")
	spriteMode := flag.Bool("sprite", false, "the results are bench/net/sprite.sh's (key=value lines; rows local and SYSTEM-RTTms)")
	base := flag.String("base", "", "with -cache or -sprite: only the rows against their twins SYSTEM@base-RTTms, run on this revision's build")
	flag.Parse()
	rows := strings.Split(*rowsFlag, ",")
	if *spriteMode {
		if *base != "" {
			spriteBase(*base, rows, *limit)
			return
		}
		spriteReport(rows, *limit)
		return
	}

	data := map[key][]sample{}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			continue
		}
		s := sample{requests: math.NaN()}
		switch f[3] {
		case "timeout":
			s.secs = timedOut
		case "failed":
			s.secs = failed
		default:
			v, err := strconv.ParseFloat(f[3], 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "report: bad time %q\n", f[3])
				os.Exit(1)
			}
			s.secs = v
		}
		if n, err := strconv.ParseFloat(f[4], 64); err == nil {
			s.requests = n
		}
		data[key{f[1], f[2]}] = append(data[key{f[1], f[2]}], s)
	}

	if *cacheMode && *base != "" {
		baseCompare(*base, rows, cacheSteps, func(r, w string) []sample { return data[key{r, w}] }, cacheTitle, *limit)
		return
	}
	if *cacheMode {
		cacheReport(rows, data, *limit)
		return
	}

	name := func(w string) string {
		if strings.HasPrefix(w, "seq ") {
			return fmt.Sprintf("%s %d MiB", w, *mib)
		}
		return w
	}
	header := func(cols []string) {
		fmt.Printf("| workload | %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat(" --- |", len(cols)+1))
	}
	title := func(r string) string {
		kind, rtt, ok := strings.Cut(r, "-")
		if !ok {
			return "loop view"
		}
		return fmt.Sprintf("%s %s", map[string]string{"serve": "shale serve", "diod": "diod"}[kind], strings.TrimSuffix(rtt, "ms")+" ms")
	}
	var cols []string
	for _, r := range rows {
		cols = append(cols, title(r))
	}

	fmt.Println("#### Medians")
	fmt.Println()
	fmt.Printf("Seconds, median of the runs, [min–max] in brackets; sequential rows also in MiB/s. A step stopped at the %d s timeout counts as slower than any that finished.\n\n", *limit)
	header(cols)
	for _, w := range workloads {
		cells := []string{}
		for _, r := range rows {
			ss := data[key{r, w}]
			if len(ss) == 0 {
				cells = append(cells, "–")
				continue
			}
			med, lo, hi, bad := stats(ss)
			c := secs(med, *limit)
			if !math.IsInf(med, 0) && !math.IsNaN(med) {
				c += fmt.Sprintf(" [%s–%s]", secs(lo, *limit), secs(hi, *limit))
				if strings.HasPrefix(w, "seq ") {
					c += fmt.Sprintf(" (%.0f MiB/s)", float64(*mib)/med)
				}
			}
			if bad > 0 {
				c += fmt.Sprintf(" (%d of %d runs did not finish)", bad, len(ss))
			}
			cells = append(cells, c)
		}
		fmt.Printf("| %s | %s |\n", name(w), strings.Join(cells, " | "))
	}

	if len(rows) > 1 && rows[0] == "loop" {
		fmt.Println()
		fmt.Println("#### Against the loop view")
		fmt.Println()
		fmt.Println("Median time as a multiple of the loop view's (1.00x = as fast, higher is slower); \">\" where the median run timed out.")
		fmt.Println()
		header(cols[1:])
		for _, w := range workloads {
			base, _, _, _ := stats(data[key{"loop", w}])
			cells := []string{}
			for _, r := range rows[1:] {
				ss := data[key{r, w}]
				med, _, _, _ := stats(ss)
				switch {
				case len(ss) == 0 || math.IsNaN(med) || math.IsNaN(base) || math.IsInf(base, 0) || base == 0:
					cells = append(cells, "–")
				case math.IsInf(med, 0):
					cells = append(cells, fmt.Sprintf(">%.0fx", float64(*limit)/base))
				default:
					cells = append(cells, fmt.Sprintf("%.2fx", med/base))
				}
			}
			fmt.Printf("| %s | %s |\n", name(w), strings.Join(cells, " | "))
		}
	}

	fmt.Println()
	fmt.Println("#### 9P requests per step")
	fmt.Println()
	fmt.Println("Messages the client sent through the relay during the step, median of the runs; \"≥\" where the median run was stopped.")
	fmt.Println()
	header(cols)
	for _, w := range workloads {
		cells := []string{}
		for _, r := range rows {
			ss := data[key{r, w}]
			var ns []float64
			stopped := 0
			for _, s := range ss {
				if !math.IsNaN(s.requests) {
					ns = append(ns, s.requests)
				}
				if math.IsInf(s.secs, 0) || math.IsNaN(s.secs) {
					stopped++
				}
			}
			if len(ns) == 0 {
				cells = append(cells, "–")
				continue
			}
			c := fmt.Sprintf("%.0f", median(ns))
			if 2*stopped > len(ss) {
				c = "≥" + c
			}
			cells = append(cells, c)
		}
		fmt.Printf("| %s | %s |\n", name(w), strings.Join(cells, " | "))
	}
}

// stats: median, min and max of the times, failures counted as the
// slowest (NaN if most runs failed), and how many did not finish.
func stats(ss []sample) (med, lo, hi float64, bad int) {
	if len(ss) == 0 {
		return math.NaN(), 0, 0, 0
	}
	var vs []float64
	nfail := 0
	for _, s := range ss {
		switch {
		case math.IsNaN(s.secs):
			nfail++
			bad++
			vs = append(vs, math.MaxFloat64) // slowest, told apart below
		case math.IsInf(s.secs, 0):
			bad++
			vs = append(vs, s.secs)
		default:
			vs = append(vs, s.secs)
		}
	}
	sort.Float64s(vs)
	med = median(vs)
	if med == math.MaxFloat64 {
		med = failed
	}
	return med, vs[0], vs[len(vs)-1], bad
}

// median of vs; of an even count the mean of the middle two, unless the
// upper one is a run that did not finish, which is never averaged in.
func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 || math.IsInf(s[n/2], 0) || s[n/2] == math.MaxFloat64 {
		return s[(n-1)/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func secs(v float64, limit int) string {
	switch {
	case math.IsNaN(v) || v == math.MaxFloat64:
		return "failed"
	case math.IsInf(v, 0):
		return fmt.Sprintf("timeout >%d s", limit)
	case v < 1: // small trees on the loop view
		return fmt.Sprintf("%.3f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}
