package main

import (
	"fmt"
	"math"
	"strings"
)

// With -B REV, bench/net/cache.sh and bench/net/sprite.sh run each network
// row SYSTEM-RTT twice a repetition: on the work tree's build and on REV's,
// as its twin SYSTEM@base-RTT (bench/net/lib.sh). With -base REV, the
// report sets the two against each other.

const baseSuffix = "@base"

// baseLimit is how much slower than the base build a row may be.
const baseLimit = 1.05

// twin is row's counterpart on the base build; "" for a row without one
// (the loop view, or a base row itself).
func twin(row string) string {
	sys, rtt, ok := strings.Cut(row, "-")
	if !ok || strings.HasSuffix(sys, baseSuffix) {
		return ""
	}
	return sys + baseSuffix + "-" + rtt
}

// onBase splits a system's name: "cached@base" is cached, on the base
// build.
func onBase(sys string) (string, bool) {
	return strings.CutSuffix(sys, baseSuffix)
}

// baseCompare prints, per network row and step, the median time on the
// current build and on the base build (rev) and their ratio, then a
// verdict: PASS if no row's step is more than 5% slower on the current
// build. runs gives a row's samples of a step (failed: NaN, timed out:
// Inf; requests NaN where not counted), title a row's name.
func baseCompare(rev string, rows, steps []string, runs func(row, step string) []sample, title func(string) string, limit int) {
	fmt.Printf("#### Against the base build (%s)\n\n", rev)
	fmt.Printf("Each network row on this build (current) and on %s's (base: its shale serve and shale mount; the relay is this build's for both), back to back in every repetition, this build first in odd repetitions and the base first in even ones. Seconds, median of the runs, [min–max]; the 9P requests of the step (median, current / base); current ÷ base, in bold above %.2fx (more than %.0f%% slower). A step that failed, or timed out on both builds, has no ratio.\n\n", rev, baseLimit, 100*(baseLimit-1))
	fmt.Println("| configuration | step | current | base | 9P requests | current ÷ base |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	cell := func(ss []sample) string {
		med, lo, hi, bad := stats(ss)
		c := secs(med, limit)
		if !math.IsInf(med, 0) && !math.IsNaN(med) && len(ss) > 1 {
			c += fmt.Sprintf(" [%s–%s]", secs(lo, limit), secs(hi, limit))
		}
		if bad > 0 {
			c += fmt.Sprintf(" (%d of %d did not finish)", bad, len(ss))
		}
		return c
	}
	reqs := func(ss []sample) string {
		var ns []float64
		for _, s := range ss {
			if !math.IsNaN(s.requests) {
				ns = append(ns, s.requests)
			}
		}
		if len(ns) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", median(ns))
	}
	type worstRow struct {
		what     string
		ratio    float64
		cur, bas float64
	}
	var (
		compared, over, spread, missing int
		worst                           = worstRow{ratio: math.NaN()}
	)
	for _, r := range rows {
		b := twin(r)
		if b == "" || !contains(rows, b) {
			continue
		}
		for _, w := range steps {
			cs, bs := runs(r, w), runs(b, w)
			if len(cs) == 0 && len(bs) == 0 {
				continue // a step the row does not run
			}
			cm, clo, _, _ := stats(cs)
			bm, _, bhi, _ := stats(bs)
			ratio := math.NaN()
			rc := "–"
			switch {
			case len(cs) == 0 || len(bs) == 0 || math.IsNaN(cm) || math.IsNaN(bm) || math.IsInf(cm, 0) && math.IsInf(bm, 0):
				missing++
			case math.IsInf(bm, 0):
				ratio, rc = 0, "faster (the base timed out)"
			case math.IsInf(cm, 0):
				ratio, rc = math.Inf(1), "**slower (timed out)**"
			case bm == 0:
				missing++
			default:
				ratio = cm / bm
				rc = fmt.Sprintf("%.2fx", ratio)
			}
			if !math.IsNaN(ratio) {
				compared++
				if ratio > baseLimit {
					over++
					if !math.IsInf(ratio, 0) {
						rc = "**" + rc + "**"
						if clo <= bhi {
							spread++
						}
					}
				}
				if math.IsNaN(worst.ratio) || ratio > worst.ratio {
					worst = worstRow{title(r) + ": " + w, ratio, cm, bm}
				}
			}
			fmt.Printf("| %s | %s | %s | %s | %s / %s | %s |\n", title(r), w, cell(cs), cell(bs), reqs(cs), reqs(bs), rc)
		}
	}
	fmt.Println()
	worstText := "none compared"
	if !math.IsNaN(worst.ratio) {
		worstText = fmt.Sprintf("worst current ÷ base %.2fx (%s, %s against %s s)", worst.ratio, worst.what, secs(worst.cur, limit), secs(worst.bas, limit))
		if math.IsInf(worst.ratio, 0) {
			worstText = fmt.Sprintf("worst: %s timed out on this build, not on the base (%s s)", worst.what, secs(worst.bas, limit))
		}
	}
	notes := ""
	if missing > 0 {
		notes += fmt.Sprintf("; %s not compared (failed, missing, or timed out on both builds)", plural(missing, "row"))
	}
	if over > 0 && spread > 0 {
		notes += fmt.Sprintf("; of those slower, %d within the runs' spread (this build's fastest run no slower than the base's slowest)", spread)
	}
	if over == 0 && missing == 0 && compared > 0 {
		fmt.Printf("- PASS: no row more than %.0f%% slower than on %s (%s compared): %s\n", 100*(baseLimit-1), rev, plural(compared, "row"), worstText)
	} else {
		fmt.Printf("- MISS: %d of %s more than %.0f%% slower than on %s%s: %s\n", over, plural(compared, "row"), 100*(baseLimit-1), rev, notes, worstText)
	}
}
