package net

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The fault harness (issue "A fault harness in CI"): one shale serve,
// three caching clients delaying their writes (?writedelay=3s, so that
// write-backs by age happen within the run too), a workload process per
// client (TestFaultHelperWorkload, faultwork_test.go) printing what every
// operation was told; and a loop of faults between which every workload
// must make progress: the server restarted on SIGTERM and after kill -9
// (same address and LOWER: it finds its crash marker and gives --grace),
// a client killed (-9; it is mounted again and a new workload starts in a
// new directory), and, when shale delay has --control, one client's link
// partitioned, stalled or reset and healed. Then the workloads stop, the
// living clients unmount (writing back what they hold), and LOWER is
// compared with the model the acknowledgements make:
//
//   - a living client's every acknowledged state is there exactly: not one
//     acknowledged byte lost (a failed operation leaves its own outcome
//     open, never an earlier one's);
//   - a killed client's files hold what was fsynced, or a state
//     acknowledged since; its names are exact (creates, renames, links
//     and unlinks are not delayed);
//   - a workload reading its own file back reads what the model says;
//   - a workload reading another's published file (pubK, only ever
//     overwritten) reads at least the version whose close returned
//     before its open began (Sprite's sequential sharing), unless a fault
//     came in between; a version being written meanwhile may be read cut
//     short (torn), which is counted, not failed;
//   - no operation fails unless a fault was in progress (or had ended
//     less than faultSettle before), or a failed operation left its names
//     unknown.
//
// Every run logs a summary: faults by kind, operations by kind and
// failures by error, files and bytes checked, reads checked. A failure
// names the file, what LOWER has and what the model allows (chunks, see
// faultDescribe), the file's last operations with what each was told, the
// faults around them, and the clients' log lines of note.
//
// SHALE_FAULT_ROUNDS=N (default 1) runs N rounds of 10 SIGTERM and 10
// kill -9 restarts of the server, 5 client kills and 3 link faults
// (partition, stall, reset) in a random order; a round takes two to three
// minutes. The soak run's SHALE_FAULT_ROUNDS=10 is 200 server restarts
// and 50 client kills. SHALE_FAULT_SEED fixes the order and the
// workloads' choices (it is logged; the timing never repeats exactly).
// SHALE_FAULT_SERVE="FLAGS" adds flags to the server's (--delegate).
// SHALE_FAULT_LOG=DIR keeps every workload's lines in DIR/INST.log, and
// each client's log, at debug level (its discards, its walks that found
// another file), in DIR/CLIENT.client.log.

const (
	faultClients  = 3
	faultProgress = 20               // acknowledgements each workload makes after each fault
	faultWait     = 90 * time.Second // for that progress: a client that takes longer is stuck
	faultHold     = 6 * time.Second  // a partition or stall: past the client's timeout
	faultTimeout  = "5s"             // the clients' request timeout: a partition is noticed
	faultDelay    = "3s"             // the clients' write delay
	faultGrace    = "2s"
	faultLease    = "4s"
	// Shorter than the clients' timeout: an open that waits for a
	// partitioned client's write-back goes on without it, rather than
	// fail with EIO on a healthy client.
	faultRecall = "3s"
	// After every workload made progress past a fault, its effects may
	// linger this long (the grace, a reclaim): an operation that fails,
	// or a read that finds an old version, later than that is no fault's.
	faultSettle = 2 * time.Second
)

// faultRounds is SHALE_FAULT_ROUNDS, 1 if unset.
func faultRounds(t *testing.T) int {
	v := os.Getenv("SHALE_FAULT_ROUNDS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("SHALE_FAULT_ROUNDS=%q: want a number of rounds, at least 1", v)
	}
	return n
}

// TestFaultLoops: the fault loop; see above.
func TestFaultLoops(t *testing.T) {
	rounds := faultRounds(t)
	h := newFaultHarness(t, faultClients)
	var plan []string
	for range rounds {
		for range 10 {
			plan = append(plan, "sigterm", "kill9")
		}
		for range 5 {
			plan = append(plan, "client")
		}
		plan = append(plan, "partition", "stall", "reset")
	}
	h.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	h.run(plan)
}

// TestFaultServerRestarts: the server alone, restarted on SIGTERM and
// after kill -9, three times each: a short loop to tell a failure of
// TestFaultLoops from one of its kinds.
func TestFaultServerRestarts(t *testing.T) {
	h := newFaultHarness(t, 2)
	h.run([]string{"sigterm", "kill9", "sigterm", "kill9", "kill9", "sigterm"})
}

// TestFaultNone: the workloads without a fault, long enough for
// write-backs by age: what fails here is no fault's (nor the harness's,
// if the client is right).
func TestFaultNone(t *testing.T) {
	h := newFaultHarness(t, 2)
	h.progress("without faults", 1500, 8*time.Second)
	h.run(nil)
}

// faultHarness is one run: the server, its clients and their workloads.
type faultHarness struct {
	t       *testing.T
	t0      int64 // CLOCK_MONOTONIC at the start
	start   time.Time
	seed    uint64
	rng     *rand.Rand
	lower   string
	addr    string
	srvArgs []string
	srv     *server
	srvLogs []string          // the logs of the servers stopped so far
	sprite  map[string]uint64 // the Sprite counters of the servers stopped so far (tally)
	relay   *faultRelay
	clients []*faultClient
	works   []*faultWork // every workload, killed ones too
	events  []faultEvent
	stops   []time.Duration // how long SIGTERMed servers took to end
}

type faultEvent struct {
	kind       string
	start, end int64 // the fault, until every workload made progress after it
	note       string
}

// faultClient is one client: its mount and its current workload.
type faultClient struct {
	name     string
	url      string
	viaRelay bool
	mnt      string
	pm       *fgMount
	gen      int
	work     *faultWork
	logs     []string // the logs of its killed mounts
}

// faultWork is one workload process and what it printed.
type faultWork struct {
	inst   string
	dir    string // in the mount
	client *faultClient
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	done   chan struct{}
	stderr bytes.Buffer // read once done

	mu       sync.Mutex
	ops      []*faultOp
	bySeq    map[int64]*faultOp
	last     []string // its last lines
	garbled  []string
	lastLine atomic.Int64 // when it last printed (unix ns)
	acks     atomic.Int64
	fails    atomic.Int64

	// Set by the test's goroutine, read once the workload ended.
	killStart, killEnd int64 // CLOCK_MONOTONIC around its client's kill -9
}

func newFaultHarness(t *testing.T, nClients int) *faultHarness {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SHALE_FAULT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SHALE_FAULT_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("SHALE_FAULT_SEED=%d", seed)
	h := &faultHarness{t: t, t0: faultMono(), start: time.Now(), seed: seed, rng: rand.New(rand.NewPCG(seed, 1))}
	h.srvArgs = append(spriteArgs(), "--grace", faultGrace, "--lease", faultLease, "--recall-timeout", faultRecall)
	h.srvArgs = append(h.srvArgs, strings.Fields(os.Getenv("SHALE_FAULT_SERVE"))...)
	h.lower = tempDir(t)
	h.addr = freePort(t)
	h.srvArgs = append(h.srvArgs, h.lower)
	h.srv = serve(t, h.addr, h.srvArgs...)
	h.relay = startFaultRelay(t, h.addr)
	for i := range nClients {
		c := &faultClient{name: fmt.Sprintf("c%d", i+1)}
		addr := h.addr
		if i == nClients-1 && h.relay != nil {
			addr, c.viaRelay = h.relay.addr, true
		}
		c.url = fmt.Sprintf("9p://%s/?timeout=%s&writedelay=%s", addr, faultTimeout, faultDelay)
		c.mnt, c.pm = mountFg(t, c.url, faultMountArgs()...)
		h.clients = append(h.clients, c)
	}
	for _, c := range h.clients {
		c.work = h.startWork(c)
	}
	return h
}

// rel is a CLOCK_MONOTONIC time as seconds since the start.
func (h *faultHarness) rel(mono int64) string {
	return fmt.Sprintf("%.2fs", float64(mono-h.t0)/1e9)
}

// run injects the faults of plan, each followed by progress of every
// workload, then stops and checks.
func (h *faultHarness) run(plan []string) {
	t := h.t
	h.progress("before the first fault", 2*faultProgress, time.Second)
	for i, kind := range plan {
		ev := faultEvent{kind: kind, start: faultMono()}
		switch kind {
		case "sigterm":
			h.tally()
			t0 := time.Now()
			h.srv.stop()
			h.stops = append(h.stops, time.Since(t0))
			h.srvLogs = append(h.srvLogs, h.srv.log.String())
			h.srv = serve(t, h.addr, h.srvArgs...)
		case "kill9":
			h.tally()
			kill9(h.srv)
			h.srvLogs = append(h.srvLogs, h.srv.log.String())
			h.srv = serve(t, h.addr, h.srvArgs...)
		case "client":
			c := h.clients[h.rng.IntN(len(h.clients))]
			ev.note = c.work.inst
			h.killClient(c)
		case "partition", "stall", "reset":
			if h.relay == nil {
				ev.note = "skipped: no relay"
				break
			}
			h.relay.command(t, kind)
			if kind != "reset" {
				time.Sleep(faultHold) // the fault lasts this long; nothing is assumed of it
				h.relay.command(t, "heal")
			}
		default:
			t.Fatalf("unknown fault %q", kind)
		}
		// Some faults come at once, others after writes had time to age
		// (and be written back, or not).
		dwell := time.Duration(h.rng.IntN(4000)) * time.Millisecond
		d := h.progress(fmt.Sprintf("fault %d of %d (%s %s)", i+1, len(plan), kind, ev.note), faultProgress, 0)
		ev.end = faultMono()
		h.events = append(h.events, ev)
		time.Sleep(dwell) // calm: no fault in progress
		if (i+1)%10 == 0 || i+1 == len(plan) {
			t.Logf("%s: %d faults of %d injected; the last one's progress took %v", h.rel(ev.end), i+1, len(plan), d.Round(time.Millisecond))
		}
	}
	h.finish()
}

// tally adds the server's Sprite counters to h.sprite, before it stops.
func (h *faultHarness) tally() {
	if h.sprite == nil {
		h.sprite = map[string]uint64{}
	}
	for k, v := range h.srv.counters(h.t) {
		if strings.HasPrefix(k, "sprite.") && k != "sprite.files" && k != "sprite.delegations.held" {
			h.sprite[k] += v
		}
	}
}

// startWork starts a new workload for c, in a new directory of its mount.
func (h *faultHarness) startWork(c *faultClient) *faultWork {
	t := h.t
	t.Helper()
	w := &faultWork{
		inst:   fmt.Sprintf("%s.%d", c.name, c.gen),
		client: c,
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
		bySeq:  map[int64]*faultOp{},
	}
	c.gen++
	w.dir = filepath.Join(c.mnt, w.inst)
	w.cmd = exec.Command(os.Args[0], "-test.run=^TestFaultHelperWorkload$", "-test.count=1")
	w.cmd.Env = append(os.Environ(), faultWorkEnv+"="+w.dir, fmt.Sprintf("%s=%d", faultSeedEnv, h.seed^uint64(len(h.works)+1)*0x9e3779b97f4a7c15))
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.cmd.Stderr = &w.stderr
	var keep io.Writer = io.Discard
	if d := os.Getenv("SHALE_FAULT_LOG"); d != "" {
		f, err := os.Create(filepath.Join(d, w.inst+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		keep = f
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.lastLine.Store(time.Now().UnixNano())
	h.works = append(h.works, w)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			w.line(sc.Text())
			fmt.Fprintln(keep, sc.Text())
		}
		io.Copy(io.Discard, stdout)
		w.cmd.Wait()
		close(w.done)
	}()
	// Runs before the mount's cleanup: a workload stuck in the mount is
	// freed by stopping the mount's process.
	t.Cleanup(func() { h.stopWork(w) })
	select {
	case <-w.ready:
	case <-w.done:
		t.Fatalf("workload %s ended before it was ready:\n%s", w.inst, w.stderr.String())
	case <-time.After(faultWait):
		t.Fatalf("workload %s not ready within %v", w.inst, faultWait)
	}
	return w
}

// line takes one line of the workload's.
func (w *faultWork) line(s string) {
	w.lastLine.Store(time.Now().UnixNano())
	f := strings.Fields(s)
	if len(f) < 2 {
		return
	}
	mono, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return // the test binary's own output
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = append(w.last, s)
	if len(w.last) > 12 {
		w.last = w.last[1:]
	}
	switch f[1] {
	case "ready":
		close(w.ready)
	case "do":
		o, err := parseFaultOp(mono, f[2:])
		if err != nil {
			w.garbled = append(w.garbled, s)
			return
		}
		w.ops = append(w.ops, o)
		w.bySeq[o.seq] = o
	case "ok", "fail", "bad":
		if len(f) < 3 {
			w.garbled = append(w.garbled, s)
			return
		}
		seq, _ := strconv.ParseInt(f[2], 10, 64)
		o := w.bySeq[seq]
		if o == nil {
			w.garbled = append(w.garbled, s)
			return
		}
		o.res, o.result, o.detail = mono, f[1], strings.Join(f[3:], " ")
		if f[1] == "fail" {
			w.fails.Add(1)
		} else {
			w.acks.Add(1)
		}
	}
}

// behind says how the workload stands, for a wait that failed.
func (w *faultWork) behind() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("%s: %d acknowledged, %d failed; its last line %v ago; its last lines:\n\t%s", w.inst, w.acks.Load(), w.fails.Load(),
		time.Since(time.Unix(0, w.lastLine.Load())).Round(time.Millisecond), strings.Join(w.last, "\n\t"))
}

// stopWork ends a workload: its standard input closes, it finishes its
// operation and exits. One stuck in its mount is freed by stopping the
// mount's process (its goroutines logged).
func (h *faultHarness) stopWork(w *faultWork) {
	w.stdin.Close()
	select {
	case <-w.done:
		return
	case <-time.After(faultWait):
	}
	h.t.Errorf("workload %s is stuck in its mount: stopping the client\n%s", w.inst, w.behind())
	if w.client.pm != nil && w.killStart == 0 {
		w.client.pm.dump(h.t)
	}
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
	}
}

// progress waits until every current workload acknowledged n more
// operations, and at least dwell passed (letting writes age); it fails
// the test, with the stuck clients' goroutines, past faultWait.
func (h *faultHarness) progress(what string, n int64, dwell time.Duration) time.Duration {
	t := h.t
	t.Helper()
	start := time.Now()
	from := map[*faultWork]int64{}
	for _, c := range h.clients {
		from[c.work] = c.work.acks.Load()
	}
	for {
		var behind []*faultWork
		for w, f := range from {
			select {
			case <-w.done:
				t.Fatalf("%s: workload %s ended:\n%s\n%s", what, w.inst, w.behind(), w.stderr.String())
			default:
			}
			if w.acks.Load() < f+n {
				behind = append(behind, w)
			}
		}
		if len(behind) == 0 && time.Since(start) >= dwell {
			return time.Since(start)
		}
		if time.Since(start) > faultWait {
			var msgs []string
			for _, w := range behind {
				msgs = append(msgs, w.behind())
			}
			t.Errorf("%s: no progress within %v (%d acknowledgements wanted):\n%s\nfaults so far:\n%s",
				what, faultWait, n, strings.Join(msgs, "\n"), h.timeline())
			for _, w := range behind {
				w.client.pm.dump(t)
			}
			t.FailNow()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultMountArgs is the clients' mount flags: debug logs when kept.
func faultMountArgs() []string {
	if os.Getenv("SHALE_FAULT_LOG") != "" {
		return []string{"--log-level", "debug"}
	}
	return nil
}

// killClient kills c's mount (-9) under its workload, then mounts it
// again with a new workload in a new directory.
func (h *faultHarness) killClient(c *faultClient) {
	w := c.work
	w.killStart = faultMono()
	c.pm.kill()
	w.killEnd = faultMono()
	unix.Unmount(c.mnt, unix.MNT_DETACH)
	h.stopWork(w)
	c.logs = append(c.logs, c.pm.log.String())
	c.mnt, c.pm = mountFg(h.t, c.url, faultMountArgs()...)
	c.work = h.startWork(c)
}

// timeline is the faults injected so far, one a line.
func (h *faultHarness) timeline() string {
	var b strings.Builder
	for _, e := range h.events {
		fmt.Fprintf(&b, "\t%s-%s %s %s\n", h.rel(e.start), h.rel(e.end), e.kind, e.note)
	}
	return b.String()
}

type faultSummary struct {
	calm                      []string // operations that failed with no fault in progress
	ops, acked, fails, killed int
	byKind, failWhy           map[string]int
	files, wild, links        int
	bytes                     int64
	peeksChecked, peeksTorn   int
	peeksStale                int
	peeksSkipped              int
}

// faultRelay is shale delay --control: a link to partition, stall, reset
// and heal by a line on its standard input.
type faultRelay struct {
	addr  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	log   bytes.Buffer
}

// startFaultRelay starts shale delay --control to to, or returns nil (and
// says so) if shale delay has no --control.
func startFaultRelay(t *testing.T, to string) *faultRelay {
	t.Helper()
	help, _ := exec.Command(shale, "delay", "--help").CombinedOutput()
	if !bytes.Contains(help, []byte("--control")) {
		t.Logf("shale delay has no --control: no link faults (partition, stall) in this run")
		return nil
	}
	r := &faultRelay{addr: freePort(t), lines: make(chan string, 16)}
	r.cmd = exec.Command(shale, "delay", "--listen", r.addr, "--to", to, "--control")
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = &r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	})
	waitFor(t, "shale delay --control listening", func() string {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			return err.Error()
		}
		c.Close()
		return ""
	})
	return r
}

// command sends the relay a command and waits for its "ok CMD".
func (r *faultRelay) command(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(r.in, cmd); err != nil {
		t.Fatalf("shale delay --control: %s: %v", cmd, err)
	}
	select {
	case l, ok := <-r.lines:
		if !ok || l != "ok "+cmd {
			t.Fatalf("shale delay --control answered %q to %s (want \"ok %s\")", l, cmd, cmd)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("shale delay --control did not answer %s within 30s", cmd)
	}
}
