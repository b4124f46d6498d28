package net

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Sprite's consistency rules (seeds/001, Welch) end to end: shale serve
// and FUSE mounts of it. Writes are delayed on the client and written
// back at fsync, age, recall and unmount; an open of a file another
// client holds dirty data of recalls it first (sequential sharing); a
// file open on two clients, one writing, is cached on neither
// (concurrent sharing); what an fsync acknowledged survives kill -9 of
// the server; a killed client costs an open at most the lease and the
// recall timeout. Every wait polls against a deadline (cacheWait), so a
// busy machine passes; no test sleeps and assumes.

// defaultDelay is the client's default write delay: a check that data
// is still delayed is only made if less than this (minus a margin)
// passed since it was written.
const defaultDelay = 30 * time.Second

// spriteServer serves a new LOWER (root not squashed) with args and
// returns LOWER, the server, its address and its 9p:// URL.
func spriteServer(t *testing.T, args ...string) (string, *server, string, string) {
	t.Helper()
	lower := tempDir(t)
	addr := freePort(t)
	s := serve(t, addr, append(append(spriteArgs(), args...), lower)...)
	return lower, s, addr, "9p://" + addr + "/"
}

var spriteOnce = sync.OnceValue(func() []byte {
	out, _ := exec.Command(shale, "serve", "--help").CombinedOutput()
	return out
})

// spriteArgs is how shale serve is told to follow Sprite's rules (and not
// to squash root): --sprite, where it is not the default.
func spriteArgs() []string {
	args := []string{"--no-root-squash"}
	if bytes.Contains(spriteOnce(), []byte("--sprite ")) {
		args = append(args, "--sprite")
	}
	return args
}

// spriteStats is a mount's Sprite counters (shale stats --json's sprite
// object); it fails t if there is none: the client does not know its
// server follows the rules.
func spriteStats(t *testing.T, mnt string) map[string]any {
	t.Helper()
	s := cacheStats(t, mnt)
	sp, ok := s["sprite"].(map[string]any)
	if !ok {
		t.Fatalf("shale stats --json %s has no sprite object: %v", mnt, s)
	}
	return sp
}

// num is the number at path in a stats object (0 if absent).
func num(m map[string]any, path ...string) float64 {
	for i, k := range path {
		v := m[k]
		if i == len(path)-1 {
			f, _ := v.(float64)
			return f
		}
		m, _ = v.(map[string]any)
	}
	return 0
}

// serverStats is the server's statistics file (shale stats 9p://ADDR/).
func serverStats(t *testing.T, addr string) map[string]uint64 {
	t.Helper()
	return urlStats(t, "9p://"+addr+"/")
}

// urlStats is the statistics file of the server of a 9p:// URL.
func urlStats(t *testing.T, url string) map[string]uint64 {
	t.Helper()
	out := run(t, shale, "stats", "--json", url)
	m := map[string]uint64{}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("shale stats --json %s: %v:\n%s", url, err, out)
	}
	return m
}

// lowerHas checks (for waitFor, or once) that LOWER's file p holds want.
func lowerHas(p string, want []byte) func() string {
	return func() string {
		b, err := os.ReadFile(p)
		if err != nil {
			return err.Error()
		}
		if !bytes.Equal(b, want) {
			return fmt.Sprintf("%s has %d bytes (equal %v), want %d", p, len(b), bytes.Equal(b, want), len(want))
		}
		return ""
	}
}

// stillDelayed checks that LOWER's p has none of a delayed write's bytes
// (it is empty or absent), if the write is recent enough that the
// default delay cannot have passed.
func stillDelayed(t *testing.T, p string, since time.Time) {
	t.Helper()
	b, err := os.ReadFile(p)
	if el := time.Since(since); el > defaultDelay-5*time.Second {
		t.Logf("%v passed since the write: not checking that %s is still delayed", el, p)
		return
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if len(b) != 0 {
		t.Fatalf("LOWER's %s has %d bytes already: the write was not delayed", p, len(b))
	}
}

// TestSpriteDelayedWrite: with the default delay LOWER does not have what
// was written, while the mount reads it back and stat shows its size;
// fsync puts it in LOWER. --write-delay 0 writes through; --write-delay
// 1s writes back by itself.
func TestSpriteDelayedWrite(t *testing.T) {
	lower, _, _, url := spriteServer(t)
	a := mount(t, url)

	data := randomBytes(t, 300<<10+17)
	start := time.Now()
	writeFile(t, filepath.Join(a, "f"), data, 0o644)
	if got, err := os.ReadFile(filepath.Join(a, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the mount reads back %d bytes (%v), equal %v, want %d", len(got), err, bytes.Equal(got, data), len(data))
	}
	if st, err := os.Stat(filepath.Join(a, "f")); err != nil || st.Size() != int64(len(data)) {
		t.Fatalf("stat through the mount: %v, %v; want size %d", st, err, len(data))
	}
	stillDelayed(t, filepath.Join(lower, "f"), start)
	s := spriteStats(t, a)
	if num(s, "dirty_bytes") < float64(len(data)) || num(s, "dirty_files") < 1 {
		t.Errorf("after a delayed write of %d bytes: dirty_bytes %v, dirty_files %v", len(data), s["dirty_bytes"], s["dirty_files"])
	}

	// fsync writes it back: the earlier write and this one.
	more := randomBytes(t, 5000)
	f, err := os.OpenFile(filepath.Join(a, "f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(more, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	all := append(append([]byte{}, data...), more...)
	if msg := lowerHas(filepath.Join(lower, "f"), all)(); msg != "" {
		t.Fatalf("after fsync: %s", msg)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s = spriteStats(t, a)
	if num(s, "writebacks", "fsync") < 1 || num(s, "dirty_bytes") != 0 {
		t.Errorf("after fsync: writebacks %v, dirty_bytes %v", s["writebacks"], s["dirty_bytes"])
	}
	if num(s, "write_server_bytes") < float64(len(all)) {
		t.Errorf("write_server_bytes %v, want at least %d", s["write_server_bytes"], len(all))
	}

	// Write-through.
	b := mount(t, url, "--write-delay", "0")
	through := randomBytes(t, 100<<10)
	writeFile(t, filepath.Join(b, "through"), through, 0o644)
	if msg := lowerHas(filepath.Join(lower, "through"), through)(); msg != "" {
		t.Errorf("--write-delay 0, after close: %s", msg)
	}
	s = spriteStats(t, b)
	if num(s, "dirty_bytes") != 0 || num(s, "write_server_bytes") < float64(len(through)) {
		t.Errorf("--write-delay 0: dirty_bytes %v, write_server_bytes %v", s["dirty_bytes"], s["write_server_bytes"])
	}
	if wd, _ := s["write_delay"].(string); wd != "off" {
		t.Errorf("--write-delay 0: write_delay %q, want off", s["write_delay"])
	}

	// Written back by age.
	c := mount(t, url, "--write-delay", "1s")
	aged := randomBytes(t, 64<<10)
	writeFile(t, filepath.Join(c, "aged"), aged, 0o644)
	d := waitFor(t, "write-back by age", func() string {
		if msg := lowerHas(filepath.Join(lower, "aged"), aged)(); msg != "" {
			return fmt.Sprintf("%s; the client: %v", msg, spriteStats(t, c))
		}
		return ""
	})
	t.Logf("--write-delay 1s: LOWER had the data %v after the close", d)
	waitFor(t, "age write-back counted", func() string {
		s := spriteStats(t, c)
		if num(s, "writebacks", "age") < 1 || num(s, "dirty_bytes") != 0 {
			return fmt.Sprintf("writebacks %v, dirty_bytes %v", s["writebacks"], s["dirty_bytes"])
		}
		return ""
	})
}

// TestSpriteTempFiles: a file written and removed within the delay never
// reaches the server: its bytes are discarded, not written.
func TestSpriteTempFiles(t *testing.T) {
	lower, _, _, url := spriteServer(t)
	a := mount(t, url)
	before := spriteStats(t, a)

	// Watch LOWER's file from before it is made until after it is gone:
	// its name shows at once (a create is not delayed), its bytes never.
	var (
		maxSize atomic.Int64
		polls   atomic.Int64
		stop    = make(chan struct{})
		watched = make(chan struct{})
	)
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if st, err := os.Stat(filepath.Join(lower, "tmp")); err == nil && st.Size() > maxSize.Load() {
				maxSize.Store(st.Size())
			}
			polls.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	data := randomBytes(t, 1<<20)
	start := time.Now()
	f, err := os.Create(filepath.Join(a, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += 64 << 10 {
		if _, err := f.Write(data[off : off+64<<10]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(a, "tmp")); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	// A few more polls after the removal.
	for n := polls.Load(); polls.Load() < n+10; {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	<-watched
	t.Logf("LOWER polled %d times; the file lived %v", polls.Load(), elapsed)
	if elapsed > defaultDelay-5*time.Second {
		t.Skipf("the file lived %v: too close to the write delay to tell", elapsed)
	}
	if m := maxSize.Load(); m != 0 {
		t.Errorf("LOWER's tmp had %d bytes at a poll: the temporary file's data reached the server", m)
	}
	if _, err := os.Stat(filepath.Join(lower, "tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LOWER's tmp after the removal: %v", err)
	}
	// The release of the handle may follow the close: poll.
	var after map[string]any
	waitFor(t, "discarded bytes counted", func() string {
		after = spriteStats(t, a)
		if d := num(after, "discarded_bytes") - num(before, "discarded_bytes"); d < float64(len(data)) {
			return fmt.Sprintf("discarded_bytes grew by %v, want at least %d; dirty_bytes %v", d, len(data), after["dirty_bytes"])
		}
		return ""
	})
	if w := num(after, "write_server_bytes") - num(before, "write_server_bytes"); w >= float64(len(data)) {
		t.Errorf("write_server_bytes grew by %v for a temporary file of %d bytes", w, len(data))
	}
	if num(after, "dirty_bytes") != 0 {
		t.Errorf("dirty_bytes %v after the removal", after["dirty_bytes"])
	}
	if w := num(after, "write_bytes") - num(before, "write_bytes"); w < float64(len(data)) {
		t.Errorf("write_bytes grew by %v, want at least %d", w, len(data))
	}
}

// TestSpriteSequentialSharing: what client A wrote and closed (delayed)
// client B reads at its next open: the server recalls it from A first.
// Then B, which cached the file, reads A's next version.
//
// A's close reaches the server after close(2) returns: FUSE releases a
// file in the background. Should B's open come first, the file is still
// open for writing on A, and the server rightly treats it as concurrent
// sharing (an Uncache, not a Recall); B must read A's bytes all the same,
// and the round is made again, with a new file, until one is sequential
// (within cacheWait: the window is short).
func TestSpriteSequentialSharing(t *testing.T) {
	lower, _, addr, url := spriteServer(t)
	a, b := mount(t, url), mount(t, url)

	// round has A write data to name (made, or written over in place),
	// then B read it, which must show data; it tells whether A's writes
	// were delayed and then recalled: sequential sharing.
	round := func(name string, data []byte, create bool) bool {
		t.Helper()
		p := filepath.Join(a, name)
		before := spriteStats(t, a)
		start := time.Now()
		if create {
			writeFile(t, p, data, 0o644)
		} else {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
		shared := num(spriteStats(t, a), "opens_nocache") > num(before, "opens_nocache")
		if !shared && time.Since(start) < defaultDelay-5*time.Second {
			if b, _ := os.ReadFile(filepath.Join(lower, name)); bytes.Equal(b, data) {
				t.Fatalf("LOWER has what A wrote to %s at once: not delayed", name)
			}
		}
		t0 := time.Now()
		got, err := os.ReadFile(filepath.Join(b, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("B reads %d bytes of %s (%v), equal %v; A wrote %d\nA: %v\nB: %v", len(got), name, err,
				bytes.Equal(got, data), len(data), spriteStats(t, a), spriteStats(t, b))
		}
		took := time.Since(t0)
		if msg := lowerHas(filepath.Join(lower, name), data)(); msg != "" {
			t.Errorf("after B's open: %s", msg)
		}
		after := spriteStats(t, a)
		recalled := num(after, "recalls") > num(before, "recalls") &&
			num(after, "writebacks", "recall") > num(before, "writebacks", "recall")
		switch {
		case shared:
			t.Logf("%s: A's open was write-shared (B's release had not reached the server): again", name)
		case recalled:
			t.Logf("%s: B's read, recalling A's writes, took %v", name, took)
			return true
		case num(after, "uncaches") > num(before, "uncaches"):
			t.Logf("%s: A's release had not reached the server at B's open: an Uncache, not a Recall; again", name)
		default:
			t.Errorf("%s: A was neither recalled nor uncached: A %v", name, after)
		}
		return false
	}
	again := func(i int, what string) {
		t.Helper()
		if i >= 20 {
			t.Fatalf("%s: no sequential sharing in %d rounds", what, i)
		}
	}

	// B's first open of a file A wrote.
	for i := 0; !round(fmt.Sprintf("s%d", i), randomBytes(t, 200<<10+3), true); i++ {
		again(i, "a file B never opened")
	}
	// B cached the file; A writes a new, longer version over it.
	for i := 0; ; i++ {
		again(i, "a file B cached")
		name := fmt.Sprintf("v%d", i)
		round(name, randomBytes(t, 100<<10), true)
		before := spriteStats(t, b)
		if round(name, randomBytes(t, 300<<10), false) {
			if sb := spriteStats(t, b); num(sb, "opens_stale") <= num(before, "opens_stale") {
				t.Errorf("B opened a file A changed: opens_stale %v, %v before", sb["opens_stale"], before["opens_stale"])
			}
			break
		}
	}
	if ss := serverStats(t, addr); ss["sprite.opens.recall"] < 2 {
		t.Errorf("server: sprite.opens.recall %d, want 2", ss["sprite.opens.recall"])
	}
}

// TestSpriteConcurrentSharing: a file open for writing on two mounts at
// once is cached on neither: after each of interleaved pwrites from both,
// each mount reads what a local file given the same writes holds.
func TestSpriteConcurrentSharing(t *testing.T) {
	lower, _, addr, url := spriteServer(t)
	local := tempDir(t)
	initial := randomBytes(t, 40<<10)
	writeFile(t, filepath.Join(lower, "c"), initial, 0o644)
	writeFile(t, filepath.Join(local, "c"), initial, 0o644)
	a, b := mount(t, url), mount(t, url)
	// Both have read (and cached) the file before it is shared.
	for _, m := range []string{a, b} {
		if got, err := os.ReadFile(filepath.Join(m, "c")); err != nil || !bytes.Equal(got, initial) {
			t.Fatalf("%s: first read %d bytes, %v", m, len(got), err)
		}
	}
	open := func(dir string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "c"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	fa, fb, fl := open(a), open(b), open(local)
	names := map[*os.File]string{fa: "A", fb: "B"}
	rng := rand.New(rand.NewPCG(4, 4))
	same := func(step string) {
		t.Helper()
		want, err := os.ReadFile(filepath.Join(local, "c"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []struct {
			name string
			dir  string
			f    *os.File
		}{{"A", a, fa}, {"B", b, fb}} {
			// Through a new open of the name, and through the open handle.
			got, err := os.ReadFile(filepath.Join(m.dir, "c"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: %s reads %d bytes (%v), the local file has %d; first difference at %d",
					step, m.name, len(got), err, len(want), firstDiff(got, want))
			}
			buf := make([]byte, len(want)+100)
			k, err := m.f.ReadAt(buf, 0)
			if (err != nil && err != io.EOF) || !bytes.Equal(buf[:k], want) {
				t.Fatalf("%s: %s's open handle reads %d bytes (%v), the local file has %d; first difference at %d",
					step, m.name, k, err, len(want), firstDiff(buf[:k], want))
			}
		}
	}
	same("after both opened")
	for step := range 24 {
		w := fa
		if step%2 == 1 {
			w = fb
		}
		// Small writes at different offsets, some past the end.
		p := randomBytes(t, 1+rng.IntN(3000))
		off := int64(rng.IntN(48 << 10))
		if _, err := w.WriteAt(p, off); err != nil {
			t.Fatalf("step %d: %s writes %d at %d: %v", step, names[w], len(p), off, err)
		}
		if _, err := fl.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		same(fmt.Sprintf("step %d (%s wrote %d bytes at %d)", step, names[w], len(p), off))
	}
	want, _ := os.ReadFile(filepath.Join(local, "c"))
	for _, f := range []*os.File{fa, fb} {
		if err := f.Close(); err != nil {
			t.Errorf("close through %s: %v", names[f], err)
		}
	}
	// Shared, the writes went to the server as they were made.
	if msg := lowerHas(filepath.Join(lower, "c"), want)(); msg != "" {
		t.Errorf("LOWER after the interleaving: %s (first difference at %d)", msg, firstDiff(mustRead(t, filepath.Join(lower, "c")), want))
	}
	sa, sb := spriteStats(t, a), spriteStats(t, b)
	if num(sa, "uncaches")+num(sa, "opens_nocache") < 1 || num(sb, "opens_nocache") < 1 {
		t.Errorf("not both were told the file is shared: A uncaches %v opens_nocache %v, B opens_nocache %v",
			sa["uncaches"], sa["opens_nocache"], sb["opens_nocache"])
	}
	if ss := serverStats(t, addr); ss["sprite.opens.shared"] < 1 {
		t.Errorf("server: sprite.opens.shared %d", ss["sprite.opens.shared"])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) == len(b) {
		return -1
	}
	return min(len(a), len(b))
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kill9 kills a server with SIGKILL and waits for it to end.
func kill9(s *server) {
	s.cmd.Process.Signal(syscall.SIGKILL)
	err := <-s.done
	s.done <- err // for its cleanup's stop
}

// writerEnv names the file TestSpriteHelperWriter writes records to.
const writerEnv = "SHALE_SPRITE_WRITER"

// recSize is the size of the writer's records.
const recSize = 4096

// spriteRecord is record i: its number, then bytes of its own.
func spriteRecord(i int) []byte {
	r := rand.New(rand.NewPCG(uint64(i), 99))
	b := make([]byte, recSize)
	for j := range b {
		b[j] = byte(r.Uint32())
	}
	copy(b, fmt.Sprintf("record %08d\n", i))
	return b
}

// TestSpriteHelperWriter is no test of its own: it is the writer of
// TestSpriteFsyncSurvivesServerKill, in a process of its own (run with
// SHALE_SPRITE_WRITER=FILE), so that the test's process holds no file of
// the mount when it starts a server: a child's exec closes the files it
// inherited, and a close of a file of the mount waits for the mount.
// Through one descriptor it writes record after record at its place,
// fsyncs each, and prints "acked N" once records 0..N-1 were fsynced,
// "failed ..." when a write or fsync fails (then it tries again), until
// its standard input ends.
func TestSpriteHelperWriter(t *testing.T) {
	p := os.Getenv(writerEnv)
	if p == "" {
		t.Skip("a helper process of TestSpriteFsyncSurvivesServerKill")
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Printf("failed open: %v\n", err)
		return
	}
	var stop atomic.Bool
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
	}()
	for i := 0; !stop.Load(); {
		if _, err := f.WriteAt(spriteRecord(i), int64(i)*recSize); err != nil {
			fmt.Printf("failed write %d: %v\n", i, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err := f.Sync(); err != nil {
			fmt.Printf("failed fsync %d: %v\n", i, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		i++
		fmt.Printf("acked %d\n", i)
	}
	if err := f.Close(); err != nil {
		fmt.Printf("failed close: %v\n", err)
	}
}

// TestSpriteFsyncSurvivesServerKill: a writer fsyncs each record while
// the server is killed (-9) and restarted three times: every record an
// fsync acknowledged is in LOWER. fio, in verify mode, runs through one
// of the kills and must pass. The client serves in the foreground, so
// that a request that never ends can be ended (by stopping the client,
// its goroutines logged) and the test fails instead of hanging.
func TestSpriteFsyncSurvivesServerKill(t *testing.T) {
	const graceD = 2 * time.Second
	grace := graceD.String()
	lower, s, addr, url := spriteServer(t, "--grace", grace)
	m, pm := mountFg(t, url)

	w := exec.Command(os.Args[0], "-test.run=^TestSpriteHelperWriter$", "-test.count=1")
	w.Env = append(os.Environ(), writerEnv+"="+filepath.Join(m, "log"))
	stdin, err := w.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var werr bytes.Buffer
	w.Stderr = &werr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		acked    atomic.Int64 // records 0..acked-1 were fsynced
		failures atomic.Int64
		lastErr  atomic.Value
		lastLine atomic.Int64 // when the writer last printed (unix ns)
		done     = make(chan struct{})
	)
	lastLine.Store(time.Now().UnixNano())
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			lastLine.Store(time.Now().UnixNano())
			switch {
			case strings.HasPrefix(line, "acked "):
				n, _ := strconv.ParseInt(strings.TrimPrefix(line, "acked "), 10, 64)
				acked.Store(n)
			case strings.HasPrefix(line, "failed "):
				failures.Add(1)
				lastErr.Store(line)
			}
		}
		w.Wait()
	}()
	// Runs before the mount's cleanup: a writer stuck in the mount is
	// freed by stopping the mount's process.
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
			return
		case <-time.After(10 * time.Second):
		}
		t.Errorf("the writer is stuck in the mount: stopping the client")
		pm.dump(t)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			w.Process.Kill()
			<-done
		}
	})
	progress := func(what string) {
		t.Helper()
		from := acked.Load()
		d := waitFor(t, what, func() string {
			select {
			case <-done:
				return "the writer ended: " + werr.String()
			default:
			}
			if n := acked.Load(); n < from+5 {
				e, _ := lastErr.Load().(string)
				return fmt.Sprintf("%d records acknowledged, want %d; last error: %s; the writer's last line %v ago",
					n, from+5, e, time.Since(time.Unix(0, lastLine.Load())).Round(time.Millisecond))
			}
			return ""
		})
		t.Logf("%s: 5 more records acknowledged in %v (%d in all)", what, d, acked.Load())
	}

	// probe opens a file of LOWER the client never opened and checks the
	// open waited for the grace, if it began within it.
	probe := func(name string, killed time.Time) {
		t.Helper()
		writeFile(t, filepath.Join(lower, name), []byte(name), 0o644)
		t0 := time.Now()
		got, err := os.ReadFile(filepath.Join(m, name))
		if err != nil || string(got) != name {
			t.Errorf("%s reads %q, %v", name, got, err)
		}
		t.Logf("after kill -9 the open of %s took %v", name, time.Since(t0))
		ss := serverStats(t, addr)
		switch {
		case ss["sprite.opens.grace"] >= 1:
		case t0.Sub(killed) >= graceD:
			t.Logf("the open came %v after the kill, past the grace: not checking it waited", t0.Sub(killed))
		default:
			t.Errorf("after kill -9: sprite.opens.grace %d, want an open that waited for the grace", ss["sprite.opens.grace"])
		}
	}
	writeFile(t, filepath.Join(lower, "probe"), []byte("probe"), 0o644)

	fio, _ := exec.LookPath("fio")
	if fio == "" {
		t.Log("no fio: not running it")
	}
	var (
		fioDone = make(chan error, 1)
		fioOut  bytes.Buffer
		fioRan  bool
		fioPid  int
	)
	progress("before the first kill")
	for kill := 1; kill <= 3; kill++ {
		if kill == 2 && fio != "" {
			fioRan = true
			// --thread: the job runs in fio's own process, whose I/O
			// counts then tell whether it moves (waitMoving).
			cmd := exec.Command(fio, "--name=verify", "--filename="+filepath.Join(m, "fio"),
				"--size=8m", "--bs=4k", "--rw=randwrite", "--ioengine=psync", "--fsync=16",
				"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--thread")
			cmd.Stdout, cmd.Stderr = &fioOut, &fioOut
			cmd.Dir = t.TempDir() // fio writes its verify state to its cwd, not the tree
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			fioPid = cmd.Process.Pid
			go func() { fioDone <- cmd.Wait() }()
			t.Cleanup(func() {
				// Before the mount's cleanup, which would wait for it.
				select {
				case err := <-fioDone:
					fioDone <- err
				case <-time.After(10 * time.Second):
					t.Errorf("fio is stuck in the mount: stopping the client")
					cmd.Process.Kill()
					pm.dump(t)
				}
			})
			// Once fio has written something, kill the server under it.
			waitFor(t, "fio started", func() string {
				if st, err := os.Stat(filepath.Join(m, "fio")); err != nil || st.Size() == 0 {
					return fmt.Sprintf("fio's file: %v", err)
				}
				return ""
			})
		}
		killed := time.Now()
		kill9(s)
		s = serve(t, addr, append(spriteArgs(), "--grace", grace, lower)...)
		if kill == 3 {
			// The server found its marker: an unclean end. An open of a
			// file the client holds nothing of waits for the grace, if
			// it comes within it (the grace began after the kill).
			probe(fmt.Sprintf("probe%d", kill), killed)
		}
		progress(fmt.Sprintf("after kill %d", kill))
	}
	if fioRan {
		if err, ok := waitMoving(fioPid, fioDone, cacheWait); !ok {
			t.Errorf("fio did no I/O for %v after the last restart:\n%s", cacheWait, fioOut.String())
		} else if err != nil {
			t.Errorf("fio through a server kill: %v\n%s", err, fioOut.String())
		} else {
			t.Logf("fio passed its verification through a server kill")
		}
	}
	stdin.Close()
	select {
	case <-done:
	case <-time.After(cacheWait):
		t.Fatalf("the writer did not end within %v", cacheWait)
	}
	n := acked.Load()
	t.Logf("%d records acknowledged; %d writes or fsyncs failed meanwhile", n, failures.Load())
	got := mustRead(t, filepath.Join(lower, "log"))
	if int64(len(got)) < n*recSize {
		t.Fatalf("LOWER's log has %d bytes; %d records of %d were fsynced", len(got), n, recSize)
	}
	for i := range int(n) {
		if !bytes.Equal(got[i*recSize:(i+1)*recSize], spriteRecord(i)) {
			t.Fatalf("record %d of %d acknowledged differs in LOWER", i, n)
		}
	}
	// A clean stop leaves no marker: no grace after it.
	s.stop()
	s = serve(t, addr, append(spriteArgs(), "--grace", grace, lower)...)
	t0 := time.Now()
	if got, err := os.ReadFile(filepath.Join(m, "probe")); err != nil || string(got) != "probe" {
		t.Errorf("after a clean restart: probe reads %q, %v", got, err)
	}
	t.Logf("after a clean restart the first open took %v", time.Since(t0))
	if ss := serverStats(t, addr); ss["sprite.opens.grace"] != 0 {
		t.Errorf("after a clean restart: sprite.opens.grace %d, want 0 (no grace)", ss["sprite.opens.grace"])
	}
	// The client ends before the server: it writes back what it holds.
	pm.unmount(t)
}

// fgMount is a shale mount -f: a process of the test's own, to kill.
type fgMount struct {
	mnt  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process ended
	log  bytes.Buffer  // its output: read only once done
}

// mountFg mounts url at a new directory with shale mount -f, and returns
// it once mounted. Its cleanup unmounts it if the test did not.
func mountFg(t *testing.T, url string, args ...string) (string, *fgMount) {
	t.Helper()
	mnt := tempDir(t)
	p := &fgMount{mnt: mnt, done: make(chan struct{})}
	p.cmd = exec.Command(shale, append(append([]string{"mount", "-f"}, args...), url, mnt)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
			unix.Unmount(mnt, unix.MNT_DETACH) // if it was killed
		default:
			p.unmount(t)
		}
	})
	waitFor(t, "shale mount -f mounted", func() string {
		select {
		case <-p.done:
			return "shale mount -f ended: " + p.log.String()
		default:
		}
		if !mounted(mnt) {
			return "not mounted yet"
		}
		return ""
	})
	return mnt, p
}

// unmount unmounts the mount and waits for its process to end, which
// writes back the delayed writes first: the server must be up. A process
// that does not end is stopped, its goroutines logged.
func (p *fgMount) unmount(t *testing.T) {
	t.Helper()
	if err := unix.Unmount(p.mnt, 0); err != nil {
		t.Errorf("unmount %s: %v", p.mnt, err)
		unix.Unmount(p.mnt, unix.MNT_DETACH)
	}
	select {
	case <-p.done:
	case <-time.After(cacheWait):
		t.Errorf("shale mount -f did not end within %v of the unmount", cacheWait)
		p.dump(t)
	}
}

// kill kills the mount's process (-9) and waits for it: the kernel then
// fails what waits on the mount (ENOTCONN).
func (p *fgMount) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// dump ends a mount that is stuck with SIGQUIT, so that its goroutines
// are in its log, and logs those of shale's packages (killing it if it
// does not end).
func (p *fgMount) dump(t *testing.T) {
	p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill()
	}
	log, _, _ := strings.Cut(p.log.String(), "SIGQUIT")
	t.Logf("the client's log:\n%s", log)
	var keep []string
	for _, g := range strings.Split(p.log.String(), "\n\n") {
		if strings.Contains(g, "shalefs/shale/remote") || strings.Contains(g, "shalefs/shale/fuseview") {
			keep = append(keep, g)
		}
	}
	t.Logf("the client's goroutines in shale's packages when it was stopped:\n%s", strings.Join(keep, "\n\n"))
}

// mounted tells whether mnt is a mount point (in /proc/self/mountinfo).
func mounted(mnt string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && fs[4] == mnt {
			return true
		}
	}
	return false
}

// TestSpriteClientKilled: a client killed (-9) with delayed writes costs
// another client's open of the file at most the lease and the recall
// timeout; the open sees the server's content.
func TestSpriteClientKilled(t *testing.T) {
	const lease, recall = 2 * time.Second, 2 * time.Second
	lower, _, addr, url := spriteServer(t, "--lease", lease.String(), "--recall-timeout", recall.String())
	old := []byte("the server's content, old but all it has\n")
	writeFile(t, filepath.Join(lower, "f"), old, 0o644)
	b := mount(t, url)

	// Client A serves in the foreground: a process to kill.
	a, pa := mountFg(t, url)
	f, err := os.OpenFile(filepath.Join(a, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("NEW, NEVER WRITTEN BACK"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if s := spriteStats(t, a); num(s, "dirty_bytes") == 0 {
		t.Fatalf("A holds no dirty data: %v", s)
	}
	pa.kill()

	t0 := time.Now()
	got, err := os.ReadFile(filepath.Join(b, "f"))
	took := time.Since(t0)
	t.Logf("B's open of the file A held dirty took %v (lease %v, recall timeout %v)", took, lease, recall)
	if err != nil || !bytes.Equal(got, old) {
		t.Fatalf("B reads %q (%v), want the server's %q", got, err, old)
	}
	// Bounded by the lease and the recall timeout, plus what a busy
	// machine adds to starting B's open.
	if limit := lease + recall + 5*time.Second; took > limit {
		t.Errorf("B's open took %v, more than %v", took, limit)
	}
	if msg := lowerHas(filepath.Join(lower, "f"), old)(); msg != "" {
		t.Errorf("LOWER: %s", msg)
	}
	if ss := serverStats(t, addr); ss["sprite.recall.timeouts"] < 1 {
		t.Errorf("server: sprite.recall.timeouts %d, want 1", ss["sprite.recall.timeouts"])
	}
}

// TestSpriteStats: shale stats of a mount shows the Sprite table, the
// server's has the sprite.* lines, and both serve /metrics.
func TestSpriteStats(t *testing.T) {
	sm, cm := freePort(t), freePort(t)
	_, _, addr, url := spriteServer(t, "--metrics", sm)
	m := mount(t, url, "--metrics", cm)
	writeFile(t, filepath.Join(m, "f"), []byte("stats"), 0o644)
	if got, err := os.ReadFile(filepath.Join(m, "f")); err != nil || string(got) != "stats" {
		t.Fatalf("read back %q, %v", got, err)
	}

	out := run(t, shale, "stats", m)
	if low := strings.ToLower(out); !strings.Contains(low, "sprite") || !strings.Contains(low, "opens") {
		t.Errorf("shale stats %s has no Sprite table:\n%s", m, out)
	}
	ss := serverStats(t, addr)
	for _, k := range []string{"sprite.opens", "sprite.opens.write", "sprite.opens.recall", "sprite.opens.shared",
		"sprite.opens.grace", "sprite.recall.timeouts", "sprite.writebacks", "sprite.writebacks.refused"} {
		if _, ok := ss[k]; !ok {
			t.Errorf("shale stats 9p://%s/ has no %s line", addr, k)
		}
	}
	if ss["sprite.opens"] == 0 || ss["sprite.opens.write"] == 0 {
		t.Errorf("server: sprite.opens %d, sprite.opens.write %d, after an open for writing and one for reading",
			ss["sprite.opens"], ss["sprite.opens.write"])
	}

	for _, c := range []struct{ addr, prefix string }{{sm, "shale_server_"}, {cm, "shale_client_"}} {
		waitFor(t, "metrics at "+c.addr, func() string {
			resp, err := http.Get("http://" + c.addr + "/metrics")
			if err != nil {
				return err.Error()
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				return fmt.Sprintf("%s %v", resp.Status, err)
			}
			for _, line := range strings.Split(string(body), "\n") {
				if strings.HasPrefix(line, c.prefix) {
					return ""
				}
			}
			return fmt.Sprintf("no line starting %s in:\n%.2000s", c.prefix, body)
		})
	}
}

// waitMoving waits for a process's end, given by done (which it leaves
// holding the result), for as long as the process reads or writes: on a
// busy machine a slow program is not a stuck one. ok is false if it did
// no read or write for idle.
func waitMoving(pid int, done chan error, idle time.Duration) (err error, ok bool) {
	last, moved := ioCalls(pid), time.Now()
	for {
		select {
		case err := <-done:
			done <- err
			return err, true
		case <-time.After(time.Second):
		}
		if n := ioCalls(pid); n != last {
			last, moved = n, time.Now()
		} else if time.Since(moved) > idle {
			return nil, false
		}
	}
}

// ioCalls is the read and write system calls a process made, all its
// threads': /proc/PID/io's syscr and syscw (0 once it has gone).
func ioCalls(pid int) uint64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	var n uint64
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		if k == "syscr" || k == "syscw" {
			x, _ := strconv.ParseUint(v, 10, 64)
			n += x
		}
	}
	return n
}
