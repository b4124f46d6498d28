package net

// The fault harness's checker (faults_test.go runs it): LOWER and every
// read a workload made, against what the programs were told.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// finish stops the workloads, unmounts the living clients (which writes
// back what they hold), and checks LOWER and the reads.
func (h *faultHarness) finish() {
	t := h.t
	for _, c := range h.clients {
		c.work.stdin.Close()
	}
	for _, c := range h.clients {
		h.stopWork(c.work)
	}
	for _, c := range h.clients {
		c.pm.unmount(t)
		c.logs = append(c.logs, c.pm.log.String())
		if d := os.Getenv("SHALE_FAULT_LOG"); d != "" {
			os.WriteFile(filepath.Join(d, c.name+".client.log"), []byte(strings.Join(c.logs, "\n")), 0o644)
		}
	}
	if d := os.Getenv("SHALE_FAULT_LOG"); d != "" {
		os.WriteFile(filepath.Join(d, "server.log"), []byte(strings.Join(h.srvLogs, "\n")), 0o644) // the servers stopped by faults
	}
	h.tally()
	end := faultMono()

	var (
		sum      faultSummary
		problems int
		logWhat  = map[string]bool{}
		report   = func(format string, args ...any) { problems++; t.Errorf(format, args...) }
	)
	sum.byKind, sum.failWhy = map[string]int{}, map[string]int{}
	models := map[string]*faultModel{} // by workload
	for _, w := range h.works {
		killed := w.killStart != 0
		m := newFaultModel(w.inst)
		models[w.inst] = m
		bads, diffs := 0, 0
		touched := map[*faultOp][]int{} // the files each operation named
		w.mu.Lock()
		for _, s := range w.garbled {
			report("%s printed a line the test cannot read: %q", w.inst, s)
		}
		for _, o := range w.ops {
			if killed && o.do > w.killEnd {
				break // after the kill: the mount was gone, nothing reached the server
			}
			ok := o.result == "ok" && (!killed || o.res < w.killStart)
			if o.result != "" {
				sum.ops++
				if o.result == "fail" && !h.faulted(o.do, o.res) && !m.isWild(o.a) && (o.b == "" || !m.isWild(o.b)) {
					// Nothing failed it: no fault, no name a failed
					// operation left unknown.
					sum.calm = append(sum.calm, fmt.Sprintf("%s %s %s: %s", h.rel(o.do), w.inst, o, o.detail))
				}
				if o.result == "fail" {
					sum.fails++
					why := o.detail
					if i := strings.LastIndex(why, ": "); i >= 0 {
						why = why[i+2:]
					}
					sum.failWhy[why]++
				}
				if ok {
					sum.acked++
					sum.byKind[o.kind]++
				}
			}
			touched[o] = m.files(o)
			// A read answered after its client's kill may have read the
			// directory under the mount, once unmounted: not the file.
			if o.result == "bad" && (!killed || o.res < w.killStart) {
				if bads++; bads <= 5 {
					report("%s read back its own %s at %s: %s\n%s%s", w.inst, o.a, h.rel(o.res), o.detail, h.history(w, m, o.a, touched, o.res), h.origins(w, o.detail))
				} else {
					problems++
				}
			}
			if o.kind != "read" && o.kind != "peek" {
				m.apply(o, ok)
				for _, id := range m.files(o) {
					if !slices.Contains(touched[o], id) {
						touched[o] = append(touched[o], id)
					}
				}
			}
		}
		w.mu.Unlock()
		if bads > 5 {
			t.Errorf("%s: %d more reads of its own files differed", w.inst, bads-5)
		}
		for _, a := range m.anomalies {
			report("%s: %s", w.inst, a)
		}
		how := "alive to the end"
		if killed {
			how = "its client killed at " + h.rel(w.killStart)
			sum.killed++
		}
		// LOWER's directory against the model.
		dir := filepath.Join(h.lower, w.inst)
		names := map[string]bool{}
		for _, n := range m.present() {
			names[n] = true
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			report("%s (%s): LOWER's directory: %v", w.inst, how, err)
			continue
		}
		for _, e := range ents {
			names[e.Name()] = true
		}
		for _, n := range slices.Sorted(func(yield func(string) bool) {
			for n := range names {
				if !yield(n) {
					return
				}
			}
		}) {
			b, err := os.ReadFile(filepath.Join(dir, n))
			exists := err == nil
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				report("%s: LOWER's %s: %v", w.inst, n, err)
				continue
			}
			if m.isWild(n) {
				sum.wild++
				continue
			}
			if exists {
				sum.files++
				sum.bytes += int64(len(b))
			}
			if msg := m.check(n, b, exists, killed); msg != "" {
				logWhat[w.client.name] = true
				if diffs++; diffs > 15 {
					problems++
					continue
				}
				report("LOWER's %s/%s (%s):\n\t%s\n%s%s", w.inst, n, how, msg, h.history(w, m, n, touched, end), h.origins(w, msg))
			}
		}
		if diffs > 15 {
			t.Errorf("%s: %d more files of LOWER differ", w.inst, diffs-15)
		}
		// Hard links: the names of one file are one inode in LOWER.
		groups := map[*faultInode][]string{}
		for n, ino := range m.names {
			groups[ino] = append(groups[ino], n)
		}
		for _, ns := range groups {
			if len(ns) < 2 {
				continue
			}
			slices.Sort(ns)
			var first uint64
			for i, n := range ns {
				var st unix.Stat_t
				if unix.Stat(filepath.Join(dir, n), &st) != nil {
					continue // reported above
				}
				if i == 0 {
					first = st.Ino
				} else if st.Ino != first {
					report("%s: %v are links of one file, but %s is another inode in LOWER", w.inst, ns, n)
				}
			}
			sum.links++
		}
	}
	h.checkPeeks(&sum, report)
	if sum.peeksStale > 10 {
		report("%d more stale reads", sum.peeksStale-10)
	}

	// Summary.
	faults := map[string]int{}
	for _, e := range h.events {
		if !strings.HasPrefix(e.note, "skipped") {
			faults[e.kind]++
		}
	}
	var kinds []string
	for _, k := range []string{"sigterm", "kill9", "client", "partition", "stall", "reset"} {
		if faults[k] > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, faults[k]))
		}
	}
	var byKind []string
	for _, k := range []string{"write", "append", "fsync", "rename", "unlink", "link", "read", "peek"} {
		byKind = append(byKind, fmt.Sprintf("%s %d", k, sum.byKind[k]))
	}
	var whys []string
	for why, n := range sum.failWhy {
		whys = append(whys, fmt.Sprintf("%s %d", why, n))
	}
	slices.Sort(whys)
	var slowest time.Duration
	for _, d := range h.stops {
		slowest = max(slowest, d)
	}
	relay := "no relay (shale delay has no --control): no link faults"
	for _, c := range h.clients {
		if c.viaRelay {
			relay = c.name + " through shale delay --control"
		}
	}
	t.Logf("fault harness: %v; faults: %s (%s); slowest SIGTERM stop %v\n"+
		"\t%d workloads (%d on a client killed); %d operations, %d acknowledged (%s), %d failed (%s)\n"+
		"\tLOWER: %d files, %d bytes checked, %d sets of hard links, %d names left unknown by failed operations\n"+
		"\treads of others' files: %d checked, %d stale, %d torn (a version being written), %d skipped (a fault between, no version yet, or a failed read)\n"+
		"\tthe servers: %d opens (%d for writing), %d recalled, %d shared, %d recalls timed out, %d evictions; %d write-backs (%d refused); %d delegations granted, %d returned",
		time.Since(h.start).Round(time.Second), strings.Join(kinds, ", "), relay, slowest.Round(time.Millisecond),
		len(h.works), sum.killed, sum.ops, sum.acked, strings.Join(byKind, ", "), sum.fails, strings.Join(whys, ", "),
		sum.files, sum.bytes, sum.links, sum.wild,
		sum.peeksChecked, sum.peeksStale, sum.peeksTorn, sum.peeksSkipped,
		h.sprite["sprite.opens"], h.sprite["sprite.opens.write"], h.sprite["sprite.opens.recall"], h.sprite["sprite.opens.shared"],
		h.sprite["sprite.recall.timeouts"], h.sprite["sprite.evictions"], h.sprite["sprite.writebacks"], h.sprite["sprite.writebacks.refused"],
		h.sprite["sprite.delegations.granted"], h.sprite["sprite.delegations.returns"])
	if slices.Contains(h.srvArgs, "--delegate") && h.sprite["sprite.delegations.granted"] == 0 {
		t.Errorf("the servers ran with --delegate and granted no delegation: the run did not try them")
	}
	// A conflict copy keeps data off the server: here, where no client
	// writes another's files, it is a loss, unless a failed operation
	// left its name unknown (a rename the server made without answering).
	for _, c := range h.clients {
		for _, l := range conflictCopies(strings.Join(c.logs, "\n")) {
			inst, name, _ := strings.Cut(strings.TrimPrefix(l.file, "/"), "/")
			if m := models[inst]; m == nil || !m.isWild(name) {
				report("client %s kept %s in a conflict copy, a name no failed operation left unknown:\n\t%s", c.name, l.file, l.line)
			}
		}
	}
	for _, c := range h.clients {
		if log := strings.Join(c.logs, "\n"); strings.Contains(log, "panic in FS handler") {
			i := strings.Index(log, "panic in FS handler")
			report("client %s's mount panicked (go-fuse answered EIO):\n\t%s", c.name, log[i:min(len(log), i+1500)])
		}
	}
	if len(sum.calm) > 0 {
		report("%d operations failed with no fault in progress (the first %d):\n\t%s", len(sum.calm), min(len(sum.calm), 20),
			strings.Join(sum.calm[:min(len(sum.calm), 20)], "\n\t"))
	}
	if problems > 0 {
		t.Logf("faults (start-end of each: the fault, until every workload made progress after it):\n%s", h.timeline())
		for _, c := range h.clients {
			t.Logf("client %s's log lines of note%s:\n%s", c.name, map[bool]string{true: " (its files differ)"}[logWhat[c.name]], faultLogLines(strings.Join(c.logs, "")))
		}
	}
}

// faulted tells whether a fault was in progress at some time between
// from and to, or had ended less than faultSettle before.
func (h *faultHarness) faulted(from, to int64) bool {
	for _, e := range h.events {
		if e.start <= to && e.end+int64(faultSettle) >= from {
			return true
		}
	}
	return false
}

// history is the last operations of w before until on name or on its
// file under any name (touched: the files each operation named), with
// what each was told, and the faults around them.
func (h *faultHarness) history(w *faultWork, m *faultModel, name string, touched map[*faultOp][]int, until int64) string {
	id := 0
	if ino := m.names[name]; ino != nil {
		id = ino.id
	}
	var ops []*faultOp
	for _, o := range w.ops {
		if o.do <= until && o.kind != "read" && o.kind != "peek" && (o.a == name || o.b == name || id != 0 && slices.Contains(touched[o], id)) {
			ops = append(ops, o)
		}
	}
	if len(ops) > 10 {
		ops = ops[len(ops)-10:]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\t%s's last operations on %s or its file (%s):\n", w.inst, name, strings.Join(m.links(name), ", "))
	var from int64
	for i, o := range ops {
		if i == 0 {
			from = o.do
		}
		res := o.result
		if res == "" {
			res = "no answer"
		}
		if o.detail != "" {
			res += " (" + o.detail + ")"
		}
		fmt.Fprintf(&b, "\t\t%s %s: %s", h.rel(o.do), o, res)
		if o.res != 0 {
			fmt.Fprintf(&b, " at %s", h.rel(o.res))
		}
		b.WriteString("\n")
	}
	for _, e := range h.events {
		if e.end >= from && e.start <= until {
			fmt.Fprintf(&b, "\t\tfault %s-%s: %s %s\n", h.rel(e.start), h.rel(e.end), e.kind, e.note)
		}
	}
	if w.killStart != 0 {
		fmt.Fprintf(&b, "\t\tits client killed at %s\n", h.rel(w.killStart))
	}
	return strings.TrimRight(b.String(), "\n")
}

// origins says which operations of w wrote the chunks a mismatch
// message says a file has (before its "; want").
func (h *faultHarness) origins(w *faultWork, msg string) string {
	has, _, _ := strings.Cut(msg, "; want")
	var b strings.Builder
	seen := map[int64]bool{}
	for _, f := range strings.Split(has, w.inst+"#")[1:] {
		end := strings.IndexFunc(f, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(f)
		}
		n, err := strconv.ParseInt(f[:end], 10, 64)
		if err != nil || seen[n] {
			continue
		}
		seen[n] = true
		if o := w.bySeq[n]; o != nil {
			fmt.Fprintf(&b, "\n\t\tchunk #%d was written by %s at %s: %s", n, o, h.rel(o.do), o.result)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n\twhat it has:" + b.String()
}

// checkPeeks checks the workloads' reads of each other's published files:
// at least the version acknowledged (closed) before the read began.
func (h *faultHarness) checkPeeks(sum *faultSummary, report func(string, ...any)) {
	type ack struct{ seq, at int64 }
	works := map[string]*faultWork{}
	pubs := map[string][]ack{} // INST/pubK: its acknowledged versions in order
	for _, w := range h.works {
		works[w.inst] = w
		for _, o := range w.ops {
			if o.kind == "write" && strings.HasPrefix(o.a, "pub") && o.result == "ok" && (w.killStart == 0 || o.res < w.killStart) {
				pubs[w.inst+"/"+o.a] = append(pubs[w.inst+"/"+o.a], ack{o.seq, o.res})
			}
		}
	}
	for _, r := range h.works {
		for _, o := range r.ops {
			if o.kind != "peek" {
				continue
			}
			inst, _, _ := strings.Cut(o.a, "/")
			w := works[inst]
			if o.result != "ok" || w == nil || (w.killStart != 0 && w.killStart < o.res) || (r.killStart != 0 && o.res > r.killStart) {
				sum.peeksSkipped++
				continue
			}
			var floor *ack
			for i, a := range pubs[o.a] {
				if a.at < o.do {
					floor = &pubs[o.a][i]
				}
			}
			if floor == nil || h.faulted(floor.at, o.res) {
				sum.peeksSkipped++
				continue
			}
			sum.peeksChecked++
			class, nstr, _ := strings.Cut(o.detail, " ")
			n, _ := strconv.ParseInt(nstr, 10, 64)
			switch {
			case class == "v" && n >= floor.seq:
			case class == "part" && (n > floor.seq || n < 0), class == "zeros", class == "empty":
				sum.peeksTorn++
			default:
				if sum.peeksStale++; sum.peeksStale > 10 {
					continue // counted, said at the end
				}
				report("%s read %s at %s-%s and found %q; version #%d was acknowledged (closed) at %s, before the read began: a stale read\n%s",
					r.inst, o.a, h.rel(o.do), h.rel(o.res), o.detail, floor.seq, h.rel(floor.at),
					h.history(w, newFaultModel(w.inst), strings.TrimPrefix(o.a, inst+"/"), nil, o.res))
			}
		}
	}
}

// faultLogLines is the lines of a client's log that tell of trouble,
// at most 40 (lost connections only counted).
// conflictCopy is a client's log line of a conflict copy, and the file
// it names.
type conflictCopy struct{ line, file string }

func conflictCopies(log string) []conflictCopy {
	var cs []conflictCopy
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "conflict copy") {
			continue
		}
		file := ""
		if _, rest, ok := strings.Cut(l, " file="); ok {
			if strings.HasPrefix(rest, `"`) {
				file, _ = strconv.Unquote(rest[:strings.Index(rest[1:], `"`)+2])
			} else {
				file, _, _ = strings.Cut(rest, " ")
			}
		}
		cs = append(cs, conflictCopy{l, file})
	}
	return cs
}

func faultLogLines(log string) string {
	var keep []string
	n, conns := 0, 0
	for _, l := range strings.Split(log, "\n") {
		low := strings.ToLower(l)
		if strings.Contains(low, "connection lost") {
			conns++
			continue
		}
		if strings.Contains(low, "lost") || strings.Contains(low, "refus") || strings.Contains(low, "error") ||
			strings.Contains(low, "warn") || strings.Contains(low, "panic") {
			n++
			if len(keep) < 40 {
				keep = append(keep, "\t"+l)
			}
		}
	}
	if n > len(keep) {
		keep = append(keep, fmt.Sprintf("\t... and %d more", n-len(keep)))
	}
	return fmt.Sprintf("\t(%d lines \"9p connection lost\")\n%s", conns, strings.Join(keep, "\n"))
}
