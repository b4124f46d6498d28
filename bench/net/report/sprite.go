package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// The results of bench/net/sprite.sh: a line per repetition and row,
// "rep<TAB>row<TAB>key=value…". Keys: t_a, t_b, t_clean (seconds, or
// timeout or failed) and q_a, q_b, q_clean (the relay's requests) of the
// steps build A, build B and clean; CLIENT_KEY for each client (a, b) of
// its stats --json (requests, journal_reads, and the sprite part:
// write_bytes, write_server_bytes, discarded_bytes, lost_bytes,
// dirty_bytes, opens, opens_stale, opens_nocache, recalls, uncaches,
// wb_REASON); s_KEY for the server's sprite.KEY lines (opens,
// opens.recall, opens.shared, …). Rows: local, and SYSTEM-RTTms with
// SYSTEM delay, wt, off or deleg.
type spriteRun map[string]string

// num is the run's value of key; false if it is missing or not a number.
func (r spriteRun) num(key string) (float64, bool) {
	v, err := strconv.ParseFloat(r[key], 64)
	return v, err == nil
}

// sum is the sum of the keys' values; false if one is missing.
func (r spriteRun) sum(keys ...string) (float64, bool) {
	var s float64
	for _, k := range keys {
		v, ok := r.num(k)
		if !ok {
			return 0, false
		}
		s += v
	}
	return s, true
}

// wall is the run's time over its three steps: Inf if one timed out,
// NaN if one failed or did not run.
func (r spriteRun) wall() float64 {
	var s float64
	for _, k := range []string{"t_a", "t_b", "t_clean"} {
		switch v := r[k]; v {
		case "timeout":
			return math.Inf(1)
		case "", "failed":
			return math.NaN()
		default:
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return math.NaN()
			}
			s += f
		}
	}
	return s
}

func readSprite(in io.Reader) (map[string][]spriteRun, error) {
	data := map[string][]spriteRun{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) < 2 {
			continue
		}
		r := spriteRun{"rep": f[0]}
		for _, kv := range f[2:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("bad field %q in row %s", kv, f[1])
			}
			r[k] = v
		}
		data[f[1]] = append(data[f[1]], r)
	}
	return data, sc.Err()
}

// spriteReport prints bench/net/sprite.sh's tables.
func spriteReport(rows []string, limit int) {
	data, err := readSprite(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
	title := spriteTitle
	// each: the per-run values f gives (runs without one left out).
	each := func(r string, f func(spriteRun) (float64, bool)) []float64 {
		var vs []float64
		for _, run := range data[r] {
			if v, ok := f(run); ok && !math.IsNaN(v) {
				vs = append(vs, v)
			}
		}
		return vs
	}
	ratio := func(num, den []string) func(spriteRun) (float64, bool) {
		return func(run spriteRun) (float64, bool) {
			n, ok1 := run.sum(num...)
			d, ok2 := run.sum(den...)
			if !ok1 || !ok2 || d == 0 {
				return 0, false
			}
			return n / d, true
		}
	}
	total := func(keys ...string) func(spriteRun) (float64, bool) {
		return func(run spriteRun) (float64, bool) { return run.sum(keys...) }
	}
	requests := total("a_requests", "a_journal_reads", "b_requests", "b_journal_reads")
	pct := func(vs []float64) string {
		if len(vs) == 0 {
			return "–"
		}
		s := fmt.Sprintf("%.1f%%", 100*median(vs))
		if len(vs) > 1 {
			lo, hi := minmax(vs)
			s += fmt.Sprintf(" [%.1f–%.1f]", 100*lo, 100*hi)
		}
		return s
	}
	count := func(vs []float64) string {
		if len(vs) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", median(vs))
	}
	walls := func(r string) (vs []float64, bad int) {
		for _, run := range data[r] {
			w := run.wall()
			if math.IsNaN(w) || math.IsInf(w, 0) {
				bad++
				w = math.Inf(1)
			}
			vs = append(vs, w)
		}
		return vs, bad
	}
	var localWall float64 = math.NaN()
	if vs, bad := walls("local"); len(vs) > 0 && 2*bad < len(vs) {
		localWall = median(vs)
	}
	n := 0
	for _, r := range rows {
		n = max(n, len(data[r]))
	}

	fmt.Println("#### Sprite's measures, beside seeds/001")
	fmt.Println()
	fmt.Printf("Medians of %s, [min–max] in brackets. Written: bytes programs wrote on both clients (`shale stats --json`: sprite.write_bytes). Never reached the server: sprite.discarded_bytes / write_bytes (overwritten, truncated or deleted while delayed), both clients together; sent: write_server_bytes / write_bytes (the traffic ratio of seeds/001's Tables 11–14). Consistency actions: the server's sprite.opens.recall + sprite.opens.shared over sprite.opens (`shale stats 9p://SERVER/`), and of the recalls, those the clients answered with a write-back (their writebacks.recall; seeds/001's \"Server Write-back\" column counts only those). Requests: both clients' `requests` plus `journal_reads`; saved: 1 − delayed / write-through at the same RTT. Wall time: build A + build B + clean, seconds. B's build: the objects its make compiled after B edited the header (all of them are out of date; median), of those A's compiled, and the runs whose program printed what the edited header gives (a make that took an object for up to date links a stale one).\n\n", plural(n, "run"))
	fmt.Println("| configuration | written | never reached the server | sent to the server | opens with a consistency action | 9P requests | saved against write-through | wall time (s) | against the loop view | B's build |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		written := each(r, total("a_write_bytes", "b_write_bytes"))
		disc := each(r, ratio([]string{"a_discarded_bytes", "b_discarded_bytes"}, []string{"a_write_bytes", "b_write_bytes"}))
		sent := each(r, ratio([]string{"a_write_server_bytes", "b_write_server_bytes"}, []string{"a_write_bytes", "b_write_bytes"}))
		act := each(r, ratio([]string{"s_opens.recall", "s_opens.shared"}, []string{"s_opens"}))
		actCell := pct(act)
		if len(act) > 0 {
			actCell += fmt.Sprintf(" (%s recalls, %s of which wrote data back; %s shared; of %s opens)",
				count(each(r, total("s_opens.recall"))), count(each(r, total("a_wb_recall", "b_wb_recall"))),
				count(each(r, total("s_opens.shared"))), count(each(r, total("s_opens"))))
		}
		req := each(r, requests)
		saved := "–"
		if sys, rtt, ok := strings.Cut(r, "-"); ok && strings.TrimSuffix(sys, baseSuffix) == "delay" {
			wt := each("wt"+strings.TrimPrefix(sys, "delay")+"-"+rtt, requests)
			if len(req) > 0 && len(wt) > 0 && median(wt) > 0 {
				saved = fmt.Sprintf("%.1f%%", 100*(1-median(req)/median(wt)))
			}
		}
		wallCell, vsLoop := "–", "–"
		if vs, bad := walls(r); len(vs) > 0 {
			med := median(vs)
			lo, hi := minmax(vs)
			wallCell = secs(med, limit)
			if !math.IsInf(med, 0) {
				if len(vs) > 1 {
					wallCell += fmt.Sprintf(" [%s–%s]", secs(lo, limit), secs(hi, limit))
				}
				if !math.IsNaN(localWall) && localWall > 0 {
					vsLoop = fmt.Sprintf("%.2fx", med/localWall)
				}
			}
			if bad > 0 {
				wallCell += fmt.Sprintf(" (%d of %d runs did not finish)", bad, len(vs))
			}
		}
		wcell := "–"
		if len(written) > 0 {
			wcell = kib(median(written))
		}
		bcell := "–"
		if bc := each(r, total("b_compiled")); len(bc) > 0 {
			right := 0
			for _, run := range data[r] {
				if run["b_right"] == "1" {
					right++
				}
			}
			bcell = fmt.Sprintf("compiled %s of %s; right in %d of %d runs", count(bc), count(each(r, total("a_compiled"))), right, len(data[r]))
			if right < len(data[r]) {
				bcell = "**" + bcell + "**"
			}
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", title(r), wcell, pct(disc), pct(sent), actCell, count(req), saved, wallCell, vsLoop, bcell)
	}
	fmt.Println("| **Sprite** (seeds/001) | – | **40–50%** (Tables 11–13, 1989: 49, 48, 41%; Table 14, 1991: 38%; large compilations up to 70%) | 51–62% (Tables 1, 2: 52%, 62%) | **< 1%** (Table 4: write-back 0.34% + invalidate 0.15%; uncachable by sharing 7.5% in 1989, < 1% in 1991) | – | – | – | – | – |")

	fmt.Println()
	fmt.Println("#### Per client")
	fmt.Println()
	fmt.Println("Medians of the runs, from each client's `shale stats --json` read after the clean step. Dirty at the end: delayed bytes not yet written back nor discarded when the counters were read. Recalls: Recall records the client answered, and the write-backs they caused (a recall of a file already written back, by age, writes nothing).")
	fmt.Println()
	fmt.Println("| configuration | client | written | discarded | sent | dirty at the end | lost | write-backs by reason | opens | recalls answered | stale opens |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		if r == "local" || len(each(r, total("a_write_bytes"))) == 0 {
			continue // no Sprite counters (the loop view, --sprite=false)
		}
		for _, c := range []string{"a", "b"} {
			k := func(s string) string { return c + "_" + s }
			b := func(key string) string {
				vs := each(r, total(k(key)))
				if len(vs) == 0 {
					return "–"
				}
				return kib(median(vs))
			}
			var wb []string
			for _, reason := range []string{"age", "fsync", "recall", "uncache", "memory", "setattr", "unmount", "reset"} {
				vs := each(r, total(k("wb_"+reason)))
				if len(vs) > 0 && median(vs) > 0 {
					wb = append(wb, fmt.Sprintf("%s %.0f", reason, median(vs)))
				}
			}
			wbCell := strings.Join(wb, ", ")
			if wbCell == "" {
				wbCell = "none"
			}
			if len(each(r, total(k("write_bytes")))) == 0 {
				wbCell = "–"
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s wrote back) | %s |\n", title(r), strings.ToUpper(c),
				b("write_bytes"), b("discarded_bytes"), b("write_server_bytes"), b("dirty_bytes"), b("lost_bytes"), wbCell,
				count(each(r, total(k("opens")))), count(each(r, total(k("recalls")))), count(each(r, total(k("wb_recall")))),
				count(each(r, total(k("opens_stale")))))
		}
	}

	fmt.Println()
	fmt.Println("#### Steps")
	fmt.Println()
	fmt.Println("Seconds per step, median of the runs, and in brackets the 9P messages both clients sent through the relay during it (`shale delay`'s count, median).")
	fmt.Println()
	fmt.Println("| configuration | build A | build B | clean |")
	fmt.Println("| --- | --- | --- | --- |")
	for _, r := range rows {
		cells := []string{}
		for _, s := range []string{"a", "b", "clean"} {
			var ts []float64
			bad := 0
			for _, run := range data[r] {
				switch v := run["t_"+s]; v {
				case "timeout":
					ts = append(ts, math.Inf(1))
					bad++
				case "", "failed":
					bad++
				default:
					if f, err := strconv.ParseFloat(v, 64); err == nil {
						ts = append(ts, f)
					}
				}
			}
			c := "–"
			if len(ts) > 0 {
				c = secs(median(ts), limit)
			}
			if q := each(r, total("q_"+s)); len(q) > 0 {
				c += fmt.Sprintf(" (%.0f)", median(q))
			}
			if bad > 0 {
				c += fmt.Sprintf(" (%d of %d runs did not finish)", bad, len(data[r]))
			}
			cells = append(cells, c)
		}
		fmt.Printf("| %s | %s |\n", title(r), strings.Join(cells, " | "))
	}
}

// spriteTitle names a configuration: "write-through, 50 ms", and
// "write-through, 50 ms (base)" on the base build (-B).
func spriteTitle(r string) string {
	sys, rtt, ok := strings.Cut(r, "-")
	if !ok {
		return "loop view (local)"
	}
	sys, base := onBase(sys)
	name := map[string]string{"delay": "delayed write 30 s", "wt": "write-through", "off": "--sprite=false", "deleg": "delayed write 30 s, --delegate"}[sys]
	t := fmt.Sprintf("%s, %s ms", name, strings.TrimSuffix(rtt, "ms"))
	if base {
		t += " (base)"
	}
	return t
}

// spriteBase prints the comparison with the base build (report -sprite
// -base REV): the steps' times and the wall time (build A + build B +
// clean), with the relay's requests.
func spriteBase(rev string, rows []string, limit int) {
	data, err := readSprite(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
	steps := map[string]string{"build A": "a", "build B": "b", "clean": "clean"}
	const wall = "wall time (all three)"
	runs := func(r, w string) []sample {
		var ss []sample
		for _, run := range data[r] {
			s := sample{requests: math.NaN()}
			if w == wall {
				s.secs = run.wall()
				if q, ok := run.sum("q_a", "q_b", "q_clean"); ok {
					s.requests = q
				}
			} else {
				k := steps[w]
				switch v := run["t_"+k]; v {
				case "timeout":
					s.secs = timedOut
				case "", "failed":
					s.secs = failed
				default:
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						f = failed
					}
					s.secs = f
				}
				if q, ok := run.num("q_" + k); ok {
					s.requests = q
				}
			}
			ss = append(ss, s)
		}
		return ss
	}
	baseCompare(rev, rows, []string{"build A", "build B", "clean", wall}, runs, spriteTitle, limit)
}

func minmax(vs []float64) (lo, hi float64) {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	return s[0], s[len(s)-1]
}

// kib prints a byte count in KiB, or MiB from 10 MiB.
func kib(b float64) string {
	if b >= 10<<20 {
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", b/1024)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
