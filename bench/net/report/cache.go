package main

import (
	"fmt"
	"math"
	"strings"
)

// The steps of bench/net/cache.sh, in the order they run.
var cacheSteps = []string{
	"build (cold)", "build (hot)", "cp -a", "find (cold)", "find (warm)",
	"grep -r (cold)", "grep -r (warm)", "build (restart)", "find (restart)",
	"grep -r (restart)", "rm -r",
}

// The steps a restarted client runs again.
var restartSteps = []string{"build (restart)", "find (restart)", "grep -r (restart)"}

var cacheSystems = []string{"uncached", "cached", "disk", "deleg"}

// cacheReport prints bench/net/cache.sh's tables: rows are "local" and
// SYSTEM-RTTms.
func cacheReport(rows []string, data map[key][]sample, limit int) {
	hasLocal := false
	var rtts []string // "0ms", …, in the order given
	present := map[string]bool{}
	for _, r := range rows {
		sys, rtt, ok := strings.Cut(r, "-")
		if !ok {
			hasLocal = hasLocal || r == "local"
			continue
		}
		present[sys] = true
		if !contains(rtts, rtt) {
			rtts = append(rtts, rtt)
		}
	}
	var systems []string // each beside its twin on the base build (-B)
	for _, s := range cacheSystems {
		for _, s := range []string{s, s + baseSuffix} {
			if present[s] {
				systems = append(systems, s)
			}
		}
	}
	ms := func(rtt string) string { return strings.TrimSuffix(rtt, "ms") + " ms" }

	// medTime and medReq: the median time (Inf: timed out, NaN: failed
	// or missing) and requests (NaN: none counted) of a row's step.
	medTime := func(row, w string) float64 {
		ss := data[key{row, w}]
		if len(ss) == 0 {
			return math.NaN()
		}
		m, _, _, _ := stats(ss)
		return m
	}
	medReq := func(row, w string) float64 {
		var ns []float64
		for _, s := range data[key{row, w}] {
			if !math.IsNaN(s.requests) {
				ns = append(ns, s.requests)
			}
		}
		if len(ns) == 0 {
			return math.NaN()
		}
		return median(ns)
	}
	cell := func(row, w string) string {
		ss := data[key{row, w}]
		if len(ss) == 0 {
			return "–"
		}
		med, lo, hi, bad := stats(ss)
		c := secs(med, limit)
		if !math.IsInf(med, 0) && !math.IsNaN(med) && len(ss) > 1 {
			c += fmt.Sprintf(" [%s–%s]", secs(lo, limit), secs(hi, limit))
		}
		if q := medReq(row, w); !math.IsNaN(q) {
			if 2*bad > len(ss) {
				c += fmt.Sprintf(", ≥%.0f req", q)
			} else {
				c += fmt.Sprintf(", %.0f req", q)
			}
		}
		if bad > 0 {
			c += fmt.Sprintf(" (%d of %d did not finish)", bad, len(ss))
		}
		return c
	}

	fmt.Println("#### Medians, by added round-trip time")
	fmt.Println()
	fmt.Printf("Seconds, median of the runs, [min–max]; then the 9P requests the client sent during the step (counted by the relay, journal reads included), median of the runs. local is the loop view (no network, no relay), the same in every table. A step stopped at the %d s timeout counts as slower than any that finished (\"≥\" requests). The uncached client does not restart (it has nothing to lose).\n", limit)
	for _, rtt := range rtts {
		fmt.Println()
		fmt.Printf("##### %s\n\n", ms(rtt))
		cols := []string{}
		if hasLocal {
			cols = append(cols, "local")
		}
		cols = append(cols, systems...)
		fmt.Printf("| step | %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat(" --- |", len(cols)+1))
		for _, w := range cacheSteps {
			cells := []string{}
			if hasLocal {
				cells = append(cells, cell("local", w))
			}
			for _, s := range systems {
				cells = append(cells, cell(s+"-"+rtt, w))
			}
			fmt.Printf("| %s | %s |\n", w, strings.Join(cells, " | "))
		}
	}

	// The summary: one line per latency.
	ratio := func(a, b float64) float64 {
		if math.IsNaN(a) || math.IsNaN(b) || math.IsInf(b, 0) || b == 0 {
			return math.NaN()
		}
		return a / b
	}
	sumReq := func(row string, ws []string) float64 {
		t := 0.0
		for _, w := range ws {
			t += medReq(row, w) // NaN if any is missing
		}
		return t
	}
	pct := func(v float64) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "–"
		}
		return fmt.Sprintf("%.1f%%", 100*v)
	}
	times := func(v float64) string {
		switch {
		case math.IsNaN(v):
			return "–"
		case math.IsInf(v, 0):
			return fmt.Sprintf(">%.0fx", float64(limit)/medTime("local", "build (hot)"))
		}
		return fmt.Sprintf("%.2fx", v)
	}
	localHot := medTime("local", "build (hot)")
	saved := map[string]float64{}   // rtt: 1 − cached hot build requests / uncached's
	restart := map[string]float64{} // rtt: disk's restart requests / cached's (a cold start)
	hotRatio := map[string]float64{}
	fmt.Println()
	fmt.Println("#### What the cache saves")
	fmt.Println()
	fmt.Println("Hot build: median time as a multiple of local's. Saved: 1 − the caching client's requests on the step ÷ the uncached client's on the same step (hot build; find and grep -r warm, summed). Restart: the requests of the disk row's restarted client (build, find, grep -r, summed; and the build alone) as a share of the cached row's, whose restart is a cold start of the same steps.")
	fmt.Println()
	fmt.Println("| RTT | hot build, cached ÷ local | hot build, disk ÷ local | saved, hot build (cached) | saved, hot build (disk) | saved, find+grep warm (cached) | restart ÷ cold start | restart ÷ cold start, build only |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, rtt := range rtts {
		u, c, d := "uncached-"+rtt, "cached-"+rtt, "disk-"+rtt
		hotRatio[rtt] = ratio(medTime(c, "build (hot)"), localHot)
		saved[rtt] = 1 - ratio(medReq(c, "build (hot)"), medReq(u, "build (hot)"))
		warm := []string{"find (warm)", "grep -r (warm)"}
		restart[rtt] = ratio(sumReq(d, restartSteps), sumReq(c, restartSteps))
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", ms(rtt),
			times(hotRatio[rtt]), times(ratio(medTime(d, "build (hot)"), localHot)),
			pct(saved[rtt]), pct(1-ratio(medReq(d, "build (hot)"), medReq(u, "build (hot)"))),
			pct(1-ratio(sumReq(c, warm), sumReq(u, warm))),
			pct(restart[rtt]), pct(ratio(medReq(d, "build (restart)"), medReq(c, "build (restart)"))))
	}

	fmt.Println()
	fmt.Println("#### Targets")
	fmt.Println()
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	if r, ok := hotRatio["50ms"]; ok && !math.IsNaN(r) {
		fmt.Printf("- %s: hot build at 50 ms within 1.5x of local: cached %.2fx (%s against %s s)\n",
			verdict(r <= 1.5), r, secs(medTime("cached-50ms", "build (hot)"), limit), secs(localHot, limit))
	} else {
		fmt.Println("- not measured: hot build at 50 ms within 1.5x of local (needs local and cached at 50 ms)")
	}
	if d := medTime("deleg-50ms", "build (hot)"); !math.IsNaN(d) && !math.IsNaN(localHot) {
		r, n := ratio(d, localHot), medReq("deleg-50ms", "build (hot)")
		fmt.Printf("- %s: hot build at 50 ms within 1.5x of local and at most 10 requests, with read delegations: %.2fx (%s against %s s), %.0f requests\n",
			verdict(r <= 1.5 && n <= 10), r, secs(d, limit), secs(localHot, limit), n)
	}
	worst := func(m map[string]float64, low bool) (string, float64) {
		var wr string
		wv := math.NaN()
		for _, rtt := range rtts {
			v, ok := m[rtt]
			if !ok || math.IsNaN(v) {
				continue
			}
			if math.IsNaN(wv) || low && v < wv || !low && v > wv {
				wr, wv = rtt, v
			}
		}
		return wr, wv
	}
	if rtt, v := worst(saved, true); !math.IsNaN(v) {
		fmt.Printf("- %s: at least 90%% of requests saved on the hot run (hot build, cached against uncached): %s at %s, the least of the latencies\n",
			verdict(v >= 0.9), pct(v), ms(rtt))
	} else {
		fmt.Println("- not measured: requests saved on the hot run (needs uncached and cached)")
	}
	if rtt, v := worst(restart, false); !math.IsNaN(v) {
		fmt.Printf("- %s: a restarted client with a disk cache needs at most 5%% of a cold start's requests (build, find, grep -r): %s at %s, the most of the latencies\n",
			verdict(v <= 0.05), pct(v), ms(rtt))
	} else {
		fmt.Println("- not measured: a restarted client's requests (needs cached and disk)")
	}
}

// cacheTitle names a row in the comparison with the base build:
// "cached, 50 ms".
func cacheTitle(r string) string {
	sys, rtt, ok := strings.Cut(r, "-")
	if !ok {
		return r
	}
	return sys + ", " + strings.TrimSuffix(rtt, "ms") + " ms"
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
