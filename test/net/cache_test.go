package net

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The caching client (remote, issue 12) against a real shale serve with
// its journal controller: what one client or a writer in LOWER changes,
// the others show within one journal delivery; no stale reads under a
// randomized torture; a client that lost its connection, or restarted
// with a disk cache, catches up and serves the rest from its cache; a
// restarted controller makes clients drop everything.

// cacheWait bounds how long a change may take to show: generous, for a
// busy machine; the delays measured are logged.
const cacheWait = 20 * time.Second

// tortureTime is how long TestCacheTorture runs: SHALE_TORTURE (a Go
// duration) or the 60 s.
func tortureTime(t *testing.T) time.Duration {
	if v := os.Getenv("SHALE_TORTURE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SHALE_TORTURE=%s: %v", v, err)
		}
		return d
	}
	return time.Minute
}

// cacheServer serves a new LOWER with files f0..f(n-1) and d/, and
// returns LOWER, the server and the 9p:// URL.
func cacheServer(t *testing.T, n int, args ...string) (string, *server, string) {
	lower := tempDir(t)
	for i := range n {
		writeFile(t, filepath.Join(lower, fmt.Sprintf("f%d", i)), []byte("v0"), 0o644)
	}
	os.Mkdir(filepath.Join(lower, "d"), 0o755)
	addr := freePort(t)
	srv := serve(t, addr, append([]string{"--no-root-squash"}, append(args, lower)...)...)
	return lower, srv, "9p://" + addr + "/"
}

// cacheStats reads a mount's counters.
func cacheStats(t *testing.T, mnt string) map[string]any {
	t.Helper()
	out, err := exec.Command(shale, "stats", "--json", mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("shale stats %s: %v\n%s", mnt, err, out)
	}
	var s map[string]any
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("shale stats --json %s: %v\n%s", mnt, err, out)
	}
	return s
}

// requests is the 9P requests a mount made, its journal's reads too, and
// its reads of file data that went to the server (Treads also read
// extended attributes).
func requests(t *testing.T, mnt string) (total uint64, reads uint64) {
	total, reads, _ = requestsBy(t, mnt)
	return total, reads
}

// requestsBy is requests with the count of each 9P type.
func requestsBy(t *testing.T, mnt string) (total, reads uint64, by map[string]any) {
	s := cacheStats(t, mnt)
	by = s["requests"].(map[string]any)
	by["journal"] = s["journal_reads"]
	for _, v := range by {
		total += uint64(v.(float64))
	}
	return total, uint64(s["misses"].(map[string]any)["data"].(float64)), by
}

// waitFor polls fn until it returns "" and returns how long that took,
// or fails t with fn's last complaint.
func waitFor(t *testing.T, what string, fn func() string) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < cacheWait {
		if last = fn(); last == "" {
			return time.Since(start)
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not within %v: %s", what, cacheWait, last)
	return 0
}

func readIs(p, want string) func() string {
	return func() string {
		b, err := os.ReadFile(p)
		if err != nil {
			return err.Error()
		}
		if string(b) != want {
			return fmt.Sprintf("%s reads %q, want %q", p, b, want)
		}
		return ""
	}
}

func logDelays(t *testing.T, what string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	t.Logf("%s: %d changes, delay median %v, max %v", what, len(ds), ds[len(ds)/2], ds[len(ds)-1])
}

// TestCacheTwoClients: a change through one client, or in LOWER, shows
// in the other's next read, stat and listing within one delivery; and
// the warm client asks the server nothing for what did not change.
func TestCacheTwoClients(t *testing.T) {
	lower, _, url := cacheServer(t, 4)
	a, b := mount(t, url), mount(t, url)
	for _, m := range []string{a, b} {
		for i := range 4 {
			if got := readIs(filepath.Join(m, fmt.Sprintf("f%d", i)), "v0")(); got != "" {
				t.Fatal(got)
			}
		}
		os.ReadDir(filepath.Join(m, "d"))
	}
	// Warm: reads, stats and listings of what did not change are hits.
	before, _ := requests(t, a)
	for range 5 {
		for i := range 4 {
			os.ReadFile(filepath.Join(a, fmt.Sprintf("f%d", i)))
			os.Stat(filepath.Join(a, fmt.Sprintf("f%d", i)))
		}
		os.ReadDir(a)
	}
	after, _ := requests(t, a)
	t.Logf("warm: %d requests for 5 rounds of reads, stats and listings of 4 files", after-before)

	var data, meta, list []time.Duration
	for round := range 10 {
		v := fmt.Sprintf("round %d, longer than before", round)
		f := fmt.Sprintf("f%d", round%4)
		if round%2 == 0 {
			writeFile(t, filepath.Join(lower, f), []byte(v), 0o644)
		} else {
			writeFile(t, filepath.Join(b, f), []byte(v), 0o644)
		}
		data = append(data, waitFor(t, "read", readIs(filepath.Join(a, f), v)))

		os.Chmod(filepath.Join(lower, f), os.FileMode(0o600+round%2*0o44))
		want := os.FileMode(0o600 + round%2*0o44)
		meta = append(meta, waitFor(t, "stat", func() string {
			st, err := os.Stat(filepath.Join(a, f))
			if err != nil {
				return err.Error()
			}
			if st.Mode().Perm() != want {
				return fmt.Sprintf("mode %v, want %v", st.Mode().Perm(), want)
			}
			return ""
		}))

		name := fmt.Sprintf("n%d", round)
		where := lower
		if round%2 == 1 {
			where = b
		}
		writeFile(t, filepath.Join(where, "d", name), nil, 0o644)
		list = append(list, waitFor(t, "listing", func() string {
			ents, err := os.ReadDir(filepath.Join(a, "d"))
			if err != nil {
				return err.Error()
			}
			if len(ents) != round+1 {
				return fmt.Sprintf("%d entries, want %d", len(ents), round+1)
			}
			return ""
		}))
	}
	logDelays(t, "data", data)
	logDelays(t, "attributes", meta)
	logDelays(t, "listings", list)
}

// TestCacheTorture: three clients and LOWER change and read files at
// random. A version is delivered once every client has shown it; a read
// that starts after that must show it or a later one: zero stale reads.
//
// A read that finds only zeros is not stale data but the kernel's: a
// READ answered empty (between a rewrite's truncation and its data)
// after another request told the kernel of the file keeps the old size
// over a page it pads with zeros (fuse_short_read; docs/network.md,
// Sprite's Status). fuseview makes that rare, not impossible: it may be
// one read, and one more in every 10,000 (one in 200,000 on this machine;
// one in 800 before atomic O_TRUNC).
//
// SHALE_TORTURE=DURATION sets how long it runs; SHALE_TORTURE_RTT=DURATION
// puts a link of that round-trip time between the clients and the server.
func TestCacheTorture(t *testing.T) {
	const files = 6
	lower, srv, url := cacheServer(t, files)
	if rtt := os.Getenv("SHALE_TORTURE_RTT"); rtt != "" {
		// A slower link widens the windows a race needs.
		relay := freePort(t)
		p := delayProxy(t, relay, srv.addr, "--rtt", rtt)
		t.Cleanup(func() { stopProxy(p) })
		url = "9p://" + relay + "/"
	}
	mnts := []string{mount(t, url), mount(t, url), mount(t, url)}
	var (
		wmu       sync.Mutex // one writer at a time: versions only grow
		delivered [files]atomic.Int64
		version   [files]int64
		stale     atomic.Int64
		zeros     atomic.Int64
		reads     atomic.Int64
		delays    []time.Duration
	)
	content := func(v int64) string { return "v" + strconv.FormatInt(v, 10) + strings.Repeat(".", int(v%7)) }
	parse := func(s string) int64 {
		n, _ := strconv.ParseInt(strings.TrimRight(strings.TrimPrefix(s, "v"), "."), 10, 64)
		return n
	}
	end := time.Now().Add(tortureTime(t))
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for time.Now().Before(end) {
				f := rng.IntN(files)
				floor := delivered[f].Load()
				b, err := os.ReadFile(filepath.Join(mnts[r], fmt.Sprintf("f%d", f)))
				if err != nil || len(b) == 0 {
					continue // a rename's window; a write between its truncation and its data
				}
				reads.Add(1)
				if strings.Trim(string(b), "\x00") == "" {
					zeros.Add(1)
					continue
				}
				if got := parse(string(b)); got < floor {
					stale.Add(1)
					t.Errorf("client %d read f%d version %d after version %d was delivered: %q", r, f, got, floor, b)
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for time.Now().Before(end) {
		f := rng.IntN(files)
		wmu.Lock()
		version[f]++
		v := version[f]
		where, how := lower, "written in LOWER"
		if k := rng.IntN(4); k < 3 {
			where, how = mnts[k], fmt.Sprintf("written through client %d", k)
		}
		p := filepath.Join(where, fmt.Sprintf("f%d", f))
		if rng.IntN(3) == 0 {
			how += " by a rename"
			// Replace the file by a rename: an entry change.
			tmp := filepath.Join(where, fmt.Sprintf("tmp%d", f))
			writeFile(t, tmp, []byte(content(v)), 0o644)
			if err := os.Rename(tmp, p); err != nil {
				t.Fatal(err)
			}
		} else {
			writeFile(t, p, []byte(content(v)), 0o644)
		}
		start := time.Now()
		for i, m := range mnts {
			read := readIs(filepath.Join(m, fmt.Sprintf("f%d", f)), content(v))
			waitFor(t, fmt.Sprintf("delivery to client %d of f%d %s", i, f, how), func() string {
				if msg := read(); msg != "" {
					b, _ := os.ReadFile(filepath.Join(lower, fmt.Sprintf("f%d", f)))
					return fmt.Sprintf("%s; LOWER has %q", msg, b)
				}
				return ""
			})
		}
		delays = append(delays, time.Since(start))
		delivered[f].Store(v)
		wmu.Unlock()
	}
	wg.Wait()
	logDelays(t, "delivery to all three clients", delays)
	t.Logf("%d reads, %d stale, %d zeros", reads.Load(), stale.Load(), zeros.Load())
	if z, most := zeros.Load(), 1+reads.Load()/10000; z > most {
		t.Errorf("%d of %d reads found only zeros: more than %d", z, reads.Load(), most)
	}
	for _, m := range mnts {
		s := cacheStats(t, m)
		t.Logf("%s: hits %v misses %v records %v", m, s["hits"], s["misses"], s["records"])
	}
	// Every client lives and answers: a recall that timed out is a
	// client that held delayed writes the others did not see.
	if c := srv.counters(t); c["sprite.recall.timeouts"] != 0 || c["sprite.evictions"] != 0 {
		t.Errorf("the server gave up %d recalls and evicted %d clients, all of them alive", c["sprite.recall.timeouts"], c["sprite.evictions"])
	} else {
		t.Logf("server: %d opens, %d recalls, %d shared", c["sprite.opens"], c["sprite.opens.recall"], c["sprite.opens.shared"])
	}
}

// delayProxy runs shale delay from listen to to: a connection to kill.
func delayProxy(t *testing.T, listen, to string, args ...string) *exec.Cmd {
	cmd := exec.Command(shale, append([]string{"delay", "--listen", listen, "--to", to}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			return cmd
		}
	}
	t.Fatal("shale delay did not listen")
	return nil
}

func stopProxy(cmd *exec.Cmd) {
	cmd.Process.Kill()
	cmd.Wait()
}

// TestCacheReconnectAndRestart: a client whose connection is killed
// catches up on what changed meanwhile, and so does one restarted with
// its disk cache, serving the rest from the cache: no stale data, and
// at most 5% of a cold start's requests (issue 12's target).
func TestCacheReconnectAndRestart(t *testing.T) {
	// Enough files that what every restart costs (the journal's open and
	// reads, the root's attach: 7 requests) is not most of it.
	const files = 40
	lower, srv, _ := cacheServer(t, files)
	addr := srv.addr
	for i := range files {
		p := filepath.Join(lower, fmt.Sprintf("f%d", i))
		writeFile(t, p, randomBytes(t, 200<<10), 0o644)
		if err := unix.Setxattr(p, "user.tag", []byte(strconv.Itoa(i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	proxy := freePort(t)
	p := delayProxy(t, proxy, addr)
	defer func() { stopProxy(p) }()
	cacheDir := tempDir(t)
	url := "9p://" + proxy + "/"
	mnt := mount(t, url, "--cache-dir", cacheDir)
	// Each file read, and its extended attributes asked as ls -l, cp -a
	// and the kernel (security.capability before a write, ACLs) do.
	readAll := func() {
		t.Helper()
		for i := range files {
			p := filepath.Join(mnt, fmt.Sprintf("f%d", i))
			want, _ := os.ReadFile(filepath.Join(lower, fmt.Sprintf("f%d", i)))
			if got := readIs(p, string(want))(); got != "" {
				t.Fatalf("f%d: %.80s", i, got)
			}
			for _, name := range []string{"security.capability", "system.posix_acl_access"} {
				if _, err := unix.Getxattr(p, name, nil); err != unix.ENODATA {
					t.Fatalf("getxattr %s %s: %v", p, name, err)
				}
			}
			buf := make([]byte, 256)
			if k, err := unix.Getxattr(p, "user.tag", buf); err != nil || string(buf[:k]) != strconv.Itoa(i) {
				t.Fatalf("getxattr %s user.tag: %q %v", p, buf[:k], err)
			}
			if k, err := unix.Listxattr(p, buf); err != nil || !strings.Contains(string(buf[:k]), "user.tag") {
				t.Fatalf("listxattr %s: %q %v", p, buf[:k], err)
			}
		}
	}
	readAll()
	cold, coldReads, by := requestsBy(t, mnt)
	t.Logf("cold: %d requests (%d data reads): %v", cold, coldReads, by)

	// Kill the connection, change two files, let it come back.
	stopProxy(p)
	writeFile(t, filepath.Join(lower, "f1"), []byte("changed while away"), 0o644)
	writeFile(t, filepath.Join(lower, "d", "new"), []byte("new"), 0o644)
	p = delayProxy(t, proxy, addr)
	d := waitFor(t, "catch up after reconnecting", readIs(filepath.Join(mnt, "f1"), "changed while away"))
	t.Logf("reconnected and caught up in %v", d)
	waitFor(t, "new name", readIs(filepath.Join(mnt, "d", "new"), "new"))
	before, beforeReads := requests(t, mnt)
	readAll()
	after, afterReads := requests(t, mnt)
	t.Logf("after reconnecting: %d requests (%d data reads) to read all again", after-before, afterReads-beforeReads)
	if afterReads != beforeReads {
		t.Errorf("%d data reads for files that did not change", afterReads-beforeReads)
	}

	// Restart the client with its disk cache; change a file meanwhile.
	// shale umount returns once the serving process saved the cache.
	if out, err := exec.Command(shale, "umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("shale umount: %v: %s", err, out)
	}
	writeFile(t, filepath.Join(lower, "f2"), []byte("changed while stopped"), 0o644)
	run(t, shale, "mount", "--cache-dir", cacheDir, url, mnt)
	waitFor(t, "catch up after a restart", readIs(filepath.Join(mnt, "f2"), "changed while stopped"))
	readAll()
	hot, hotReads, by := requestsBy(t, mnt)
	t.Logf("restarted with the disk cache: %d requests (%d data reads) vs %d (%d) cold, %.1f%%: %v",
		hot, hotReads, cold, coldReads, 100*float64(hot)/float64(cold), by)
	if hotReads > 2 {
		t.Errorf("%d data reads after a restart with the disk cache; one file changed", hotReads)
	}
	// Sprite's rules have every open reach the server (a walk, a Tlopen
	// and its clunk: opens are how it knows whom to recall from); the
	// rest must stay within issue 12's 5% of a cold start.
	num := func(k string) uint64 { v, _ := by[k].(float64); return uint64(v) }
	opens := num("lopen")
	own := hot - min(hot, 3*opens)
	if own*20 > cold || num("walk") > opens+2 {
		t.Errorf("restarted client made %d requests, %d of them for %d opens: the rest (%d) is more than 5%% of a cold one's %d", hot, hot-own, opens, own, cold)
	}

	// A second mount of the cache directory is refused, in one line.
	other := tempDir(t)
	out, err := exec.Command(shale, "mount", "--cache-dir", cacheDir, url, other).CombinedOutput()
	if err == nil {
		umount(other)
		t.Fatal("a second mount of one cache directory succeeded")
	}
	if msg := strings.TrimSpace(string(out)); strings.Count(msg, "\n") > 0 || !strings.Contains(msg, "in use") {
		t.Errorf("second mount of the cache directory: %q", msg)
	}
}

// TestCacheControllerRestart: a restarted controller has a new epoch and
// no journals: clients drop everything and show what changed meanwhile.
func TestCacheControllerRestart(t *testing.T) {
	lower := tempDir(t)
	writeFile(t, filepath.Join(lower, "f"), []byte("before"), 0o644)
	addr := freePort(t)
	s := serve(t, addr, "--no-root-squash", lower)
	url := "9p://" + addr + "/"
	a, b := mount(t, url), mount(t, url)
	for _, m := range []string{a, b} {
		waitFor(t, "first read", readIs(filepath.Join(m, "f"), "before"))
	}
	s.stop()
	writeFile(t, filepath.Join(lower, "f"), []byte("after the restart"), 0o644)
	serve(t, addr, "--no-root-squash", lower)
	for _, m := range []string{a, b} {
		// The mount's next request waits for the connection; once the
		// journal is created again, nothing cached before is served.
		d := waitFor(t, "after the controller's restart", readIs(filepath.Join(m, "f"), "after the restart"))
		t.Logf("%s shows the change %v after the restart", m, d)
	}
	writeFile(t, filepath.Join(b, "f"), []byte("through b"), 0o644)
	waitFor(t, "a change after the restart", readIs(filepath.Join(a, "f"), "through b"))
}

// TestCacheWatch: shale watch prints changes under a path.
func TestCacheWatch(t *testing.T) {
	lower, _, url := cacheServer(t, 1)
	w := exec.Command(shale, "watch", "--json", url, "/d")
	var out strings.Builder
	var mu sync.Mutex
	w.Stdout = writerFunc(func(b []byte) { mu.Lock(); out.Write(b); mu.Unlock() })
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		w.Process.Signal(os.Interrupt)
		if err := w.Wait(); err != nil {
			t.Errorf("shale watch ended with %v on SIGINT", err)
		}
	}()
	// It walks /d before it reports: poll with a change until one shows.
	i := 0
	waitFor(t, "watch", func() string {
		i++
		writeFile(t, filepath.Join(lower, "d", fmt.Sprintf("x%d", i)), nil, 0o644)
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(out.String(), `"path":"/d/x`) {
			return "nothing printed: " + out.String()
		}
		return ""
	})
	writeFile(t, filepath.Join(lower, "f0"), []byte("outside"), 0o644)
	writeFile(t, filepath.Join(lower, "d", "x1"), []byte("data"), 0o644)
	waitFor(t, "modify", func() string {
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(out.String(), `{"event":"modify","path":"/d/x1"`) {
			return "no modify of /d/x1: " + out.String()
		}
		return ""
	})
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(out.String(), "f0") {
		t.Errorf("a change outside the watched path was printed: %s", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	sort.Strings(lines)
	t.Logf("watch printed:\n%s", strings.Join(lines, "\n"))
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// TestCacheUpstreamDiod: the controller in front of diod (shale serve
// --upstream): a change through one caching client shows in the other
// within one delivery. Changes made on diod's tree directly are the
// documented limit, so the writer is a client.
func TestCacheUpstreamDiod(t *testing.T) {
	if out, _ := exec.Command(shale, "serve", "--help").CombinedOutput(); !strings.Contains(string(out), "--upstream") {
		t.Skip("shale serve has no --upstream")
	}
	lower := tempDir(t)
	writeFile(t, filepath.Join(lower, "f"), []byte("v0"), 0o644)
	os.Mkdir(filepath.Join(lower, "d"), 0o755)
	dir := tempDir(t)
	diodSock := filepath.Join(dir, "diod.sock")
	diod := exec.Command("diod", "-f", "-n", "-e", lower, "-l", diodSock, "-L", filepath.Join(dir, "diod.log"))
	if err := diod.Start(); err != nil {
		t.Skip("no diod:", err)
	}
	t.Cleanup(func() { diod.Process.Kill(); diod.Wait() })
	waitFor(t, "diod listening", func() string {
		c, err := net.Dial("unix", diodSock)
		if err != nil {
			return err.Error()
		}
		c.Close()
		return ""
	})
	addr := freePort(t)
	serve(t, addr, "--no-root-squash", "--upstream", "unix:"+diodSock+"?aname="+lower)
	url := "9p://" + addr + "/"
	a, b := mount(t, url), mount(t, url)
	for _, m := range []string{a, b} {
		waitFor(t, "first read", readIs(filepath.Join(m, "f"), "v0"))
		os.ReadDir(filepath.Join(m, "d"))
	}
	var data, list []time.Duration
	for round := range 6 {
		v := fmt.Sprintf("round %d", round)
		writer, reader := a, b
		if round%2 == 1 {
			writer, reader = b, a
		}
		writeFile(t, filepath.Join(writer, "f"), []byte(v), 0o644)
		data = append(data, waitFor(t, "read through diod", readIs(filepath.Join(reader, "f"), v)))
		writeFile(t, filepath.Join(writer, "d", fmt.Sprintf("n%d", round)), nil, 0o644)
		list = append(list, waitFor(t, "listing through diod", func() string {
			ents, err := os.ReadDir(filepath.Join(reader, "d"))
			if err != nil {
				return err.Error()
			}
			if len(ents) != round+1 {
				return fmt.Sprintf("%d entries, want %d", len(ents), round+1)
			}
			return ""
		}))
	}
	logDelays(t, "data through diod", data)
	logDelays(t, "listings through diod", list)
	if s := cacheStats(t, a); !s["caching"].(bool) {
		t.Errorf("the client of the controller in front of diod does not cache: %v", s)
	}
}
