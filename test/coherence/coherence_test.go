// Package coherence tests that the views of one stack, mounted at once by
// `shale mount --stack`, never serve each other's changes stale: the same
// steps run with the coherence manager on, where every check must hold,
// and off, where the checks that depend on it must fail — proof that they
// can.
package coherence

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

var shaleBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/coherence mounts FUSE file systems: run it as root")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "shale-coherence-bin")
	if err != nil {
		panic(err)
	}
	if shaleBin, err = shaletest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// views are the mounts of one stack: the lower directory itself (raw),
// crypt over it (enc), and rot13 over crypt (r13).
type views struct {
	lower, raw, enc, r13 string
}

func mountStack(t *testing.T, coherence string) views {
	t.Helper()
	lower, m := mountViews(t, coherence, 0, 1, 2)
	return views{lower: lower, raw: m[0], enc: m[1], r13: m[2]}
}

// mountViews mounts, with `shale mount --stack`, crypt over a new lower
// directory and rot13 over crypt, with a view of each of layers (0: the
// lower directory, 1: crypt, 2: rot13), and returns the lower directory
// and the views' mountpoints.
func mountViews(t *testing.T, coherence string, layers ...int) (string, []string) {
	t.Helper()
	return mountLayers(t, coherence, []string{"crypt", "rot13"}, layers...)
}

// mountLayers is mountViews for the stack of the named layers over a new
// lower directory, bottom-most first; a crypt layer must be the first.
func mountLayers(t *testing.T, coherence string, names []string, layers ...int) (string, []string) {
	t.Helper()
	base := t.TempDir()
	lower := filepath.Join(base, "lower")
	if err := os.Mkdir(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("lower = %q\n", lower)
	for _, name := range names {
		toml += fmt.Sprintf("[[layer]]\nname = %q\n", name)
		if name != "crypt" {
			continue
		}
		pass := filepath.Join(base, "pass")
		os.WriteFile(pass, []byte("coherence\n"), 0o600)
		if out, err := exec.Command(shaleBin, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", lower).CombinedOutput(); err != nil {
			t.Fatalf("shale init: %v: %s", err, out)
		}
		toml += fmt.Sprintf("passfile = %q\n", pass)
	}
	var mnts []string
	for i, l := range layers {
		m := filepath.Join(base, fmt.Sprintf("view%d-layer%d", i, l))
		if err := os.Mkdir(m, 0o755); err != nil {
			t.Fatal(err)
		}
		mnts = append(mnts, m)
		toml += fmt.Sprintf("[[view]]\nlayer = %d\nmountpoint = %q\n", l, m)
	}
	stack := filepath.Join(base, "stack.toml")
	os.WriteFile(stack, []byte(toml), 0o644)
	if out, err := exec.Command(shaleBin, "mount", "--coherence="+coherence, "--stack", stack).CombinedOutput(); err != nil {
		t.Fatalf("shale mount --stack: %v: %s", err, out)
	}
	t.Cleanup(func() {
		// Each view is unmounted on its own, as any mount is.
		for _, m := range mnts {
			unmountView(t, func(args ...string) *exec.Cmd { return exec.Command(shaleBin, args...) }, m)
		}
	})
	return lower, mnts
}

func mounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return bytes.Contains(b, []byte(" "+dir+" "))
}

func rot13(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z':
			return 'a' + (r-'a'+13)%26
		case 'A' <= r && r <= 'Z':
			return 'A' + (r-'A'+13)%26
		}
		return r
	}, s)
}

func read(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

func mode(p string) string {
	st, err := os.Lstat(p)
	if err != nil {
		return errors.Unwrap(err).Error()
	}
	return fmt.Sprintf("%o", st.Mode().Perm())
}

func nlink(p string) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err.Error()
	}
	return fmt.Sprint(st.Nlink)
}

func size(p string) string {
	st, err := os.Lstat(p)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(st.Size())
}

// A check changes something through one view after the others have
// cached it, and returns what another view shows and what it should show.
type check struct {
	name string
	run  func(t *testing.T, v views) (got, want string)
	// coherent: the check depends on the manager, so it must fail
	// without it.
	coherent bool
}

var checks = []check{
	{"write in enc, read in r13", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "w"), []byte("aaaa"), 0o644)
		read(filepath.Join(v.r13, "w"))
		read(filepath.Join(v.r13, "w")) // now the page cache holds it
		os.WriteFile(filepath.Join(v.enc, "w"), []byte("bbbb"), 0o644)
		return read(filepath.Join(v.r13, "w")), rot13("bbbb")
	}, true},
	{"write in r13, read in enc", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.r13, "w2"), []byte("cccc"), 0o644)
		read(filepath.Join(v.enc, "w2"))
		read(filepath.Join(v.enc, "w2"))
		os.WriteFile(filepath.Join(v.r13, "w2"), []byte("dddd"), 0o644)
		return read(filepath.Join(v.enc, "w2")), rot13("dddd")
	}, true},
	{"truncate in r13, size in enc", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "t"), []byte("0123456789"), 0o644)
		size(filepath.Join(v.enc, "t"))
		os.Truncate(filepath.Join(v.r13, "t"), 3)
		return size(filepath.Join(v.enc, "t")) + " " + read(filepath.Join(v.enc, "t")), "3 012"
	}, true},
	{"rename in enc, stat in r13", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "old"), []byte("x"), 0o644)
		mode(filepath.Join(v.r13, "old"))
		mode(filepath.Join(v.r13, "new"))
		os.Rename(filepath.Join(v.enc, "old"), filepath.Join(v.enc, "new"))
		return mode(filepath.Join(v.r13, "old")) + " " + mode(filepath.Join(v.r13, "new")), "no such file or directory 644"
	}, true},
	{"unlink in r13, stat in enc", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.r13, "u"), []byte("x"), 0o644)
		mode(filepath.Join(v.enc, "u"))
		os.Remove(filepath.Join(v.r13, "u"))
		return mode(filepath.Join(v.enc, "u")), "no such file or directory"
	}, true},
	{"chmod in enc, stat in r13", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "c"), []byte("x"), 0o644)
		mode(filepath.Join(v.r13, "c"))
		os.Chmod(filepath.Join(v.enc, "c"), 0o600)
		return mode(filepath.Join(v.r13, "c")), "600"
	}, true},
	{"link in r13, link count in enc", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.r13, "l"), []byte("x"), 0o644)
		nlink(filepath.Join(v.enc, "l"))
		os.Link(filepath.Join(v.r13, "l"), filepath.Join(v.r13, "l2"))
		return nlink(filepath.Join(v.enc, "l")), "2"
	}, true},
	{"setxattr in enc, getxattr in r13", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "x"), []byte("x"), 0o644)
		unix.Setxattr(filepath.Join(v.enc, "x"), "user.k", []byte("v1"), 0)
		buf := make([]byte, 16)
		k, err := unix.Getxattr(filepath.Join(v.r13, "x"), "user.k", buf)
		if err != nil {
			return err.Error(), "v1"
		}
		return string(buf[:k]), "v1"
	}, false},
	{"mmap in enc sees a write in r13", func(t *testing.T, v views) (string, string) {
		p := filepath.Join(v.enc, "m")
		os.WriteFile(p, []byte("mmmm"), 0o644)
		f, err := os.Open(p)
		if err != nil {
			return err.Error(), ""
		}
		defer f.Close()
		mem, err := unix.Mmap(int(f.Fd()), 0, 4, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return err.Error(), ""
		}
		defer unix.Munmap(mem)
		before := string(mem)
		os.WriteFile(filepath.Join(v.r13, "m"), []byte(rot13("nnnn")), 0o644)
		return before + " " + string(mem), "mmmm nnnn"
	}, true},
	{"partial write in enc, raw shows the lower bytes", func(t *testing.T, v views) (string, string) {
		before := names(v.lower)
		os.WriteFile(filepath.Join(v.enc, "p"), bytes.Repeat([]byte("p"), 3*4096), 0o644)
		var enc string
		for n := range names(v.lower) {
			if !before[n] {
				enc = n
			}
		}
		read(filepath.Join(v.raw, enc))
		read(filepath.Join(v.raw, enc)) // cached
		f, _ := os.OpenFile(filepath.Join(v.enc, "p"), os.O_WRONLY, 0)
		f.WriteAt([]byte("q"), 5000) // rewrites one block, in the middle
		f.Close()
		return fmt.Sprintf("%x", read(filepath.Join(v.raw, enc))), fmt.Sprintf("%x", read(filepath.Join(v.lower, enc)))
	}, false}, // raw reads the lower file itself (FUSE passthrough): never stale, manager or not
	{"locks through two views", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "k"), []byte("k"), 0o644)
		a, _ := os.OpenFile(filepath.Join(v.enc, "k"), os.O_RDWR, 0)
		b, _ := os.OpenFile(filepath.Join(v.r13, "k"), os.O_RDWR, 0)
		defer a.Close()
		defer b.Close()
		wr := unix.Flock_t{Type: unix.F_WRLCK, Len: 1}
		errA := unix.FcntlFlock(a.Fd(), unix.F_OFD_SETLK, &wr)
		errB := unix.FcntlFlock(b.Fd(), unix.F_OFD_SETLK, &wr)
		errF := syscall.Flock(int(a.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		errG := syscall.Flock(int(b.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		return fmt.Sprint(errA, " ", errB, " ", errF, " ", errG), fmt.Sprint(nil, " ", syscall.EAGAIN, " ", nil, " ", syscall.EWOULDBLOCK)
	}, false},
}

// Changes made directly in the lower directory, by this process (not
// shale's), must show in the views once the watcher has told them
// (eventually).
var besideChecks = []check{
	{"write in lower, read in raw", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.raw, "b"), []byte("1111"), 0o644)
		read(filepath.Join(v.raw, "b"))
		read(filepath.Join(v.raw, "b"))
		os.WriteFile(filepath.Join(v.lower, "b"), []byte("2222"), 0o644)
		return eventually(func() string { return read(filepath.Join(v.raw, "b")) }, "2222")
	}, false}, // passthrough, as above
	{"chmod in lower, stat in raw", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.raw, "c"), []byte("x"), 0o644)
		mode(filepath.Join(v.raw, "c"))
		os.Chmod(filepath.Join(v.lower, "c"), 0o640)
		return eventually(func() string { return mode(filepath.Join(v.raw, "c")) }, "640")
	}, true},
	{"create and delete in lower, look up in raw", func(t *testing.T, v views) (string, string) {
		mode(filepath.Join(v.raw, "n")) // a negative entry
		os.WriteFile(filepath.Join(v.raw, "d"), []byte("x"), 0o644)
		mode(filepath.Join(v.raw, "d"))
		os.WriteFile(filepath.Join(v.lower, "n"), []byte("x"), 0o644)
		os.Remove(filepath.Join(v.lower, "d"))
		return eventually(func() string {
			return mode(filepath.Join(v.raw, "n")) + " " + mode(filepath.Join(v.raw, "d"))
		}, "644 no such file or directory")
	}, true},
	{"rename an encrypted file in lower, stat in enc", func(t *testing.T, v views) (string, string) {
		os.WriteFile(filepath.Join(v.enc, "secret"), []byte("x"), 0o644)
		mode(filepath.Join(v.enc, "secret"))
		// Its encrypted name is the one new lower name.
		before := names(v.lower)
		os.WriteFile(filepath.Join(v.enc, "other"), []byte("y"), 0o644)
		var enc string
		for n := range names(v.lower) {
			if !before[n] {
				enc = n
			}
		}
		mode(filepath.Join(v.enc, "other"))
		os.Rename(filepath.Join(v.lower, enc), filepath.Join(v.lower, enc+"x")) // no longer decodes
		return eventually(func() string { return mode(filepath.Join(v.enc, "other")) }, "no such file or directory")
	}, true},
}

func names(dir string) map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

// patience is how long eventually polls: settle where the views must
// agree; a second with coherence off, where the checks must show stale
// reads, which a busy machine only makes staler (polling for settle there
// would only slow the run).
var patience = settle

// patient sets patience for checks with coherence on or off, until the
// returned function runs.
func patient(coherence string) func() {
	old := patience
	if coherence == "off" {
		patience = time.Second
	}
	return func() { patience = old }
}

// eventually polls f for up to patience until it returns want.
func eventually(f func() string, want string) (string, string) {
	var got string
	for deadline := time.Now().Add(patience); ; {
		if got = f(); got == want || time.Now().After(deadline) {
			return got, want
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func runChecks(t *testing.T, coherence string) map[string]bool {
	defer patient(coherence)()
	v := mountStack(t, coherence)
	held := map[string]bool{}
	for _, c := range append(checks, besideChecks...) {
		got, want := c.run(t, v)
		held[c.name] = got == want
		t.Logf("coherence=%s: %s: got %q, want %q", coherence, c.name, got, want)
	}
	return held
}

func TestViewsAreCoherent(t *testing.T) {
	for name, ok := range runChecks(t, "on") {
		if !ok {
			t.Errorf("coherence on: %s: stale", name)
		}
	}
}

// Without the manager, every check that depends on it fails: the checks
// can fail, and the manager is what makes them hold.
func TestWithoutCoherenceViewsGoStale(t *testing.T) {
	all := append(checks, besideChecks...)
	var coherent []string
	for _, c := range all {
		if c.coherent {
			coherent = append(coherent, c.name)
		}
	}
	stale := staleOnce(func() map[string]bool {
		held := runChecks(t, "off")
		for _, c := range all {
			if !c.coherent && !held[c.name] {
				t.Errorf("coherence off: %s failed, but it does not depend on the manager", c.name)
			}
		}
		return held
	}, coherent)
	for _, name := range coherent {
		if !stale[name] {
			t.Errorf("coherence off: %s held; the check does not exercise coherence", name)
		}
	}
}

// staleOnce runs checks (a fresh stack each time) until each of names has
// gone stale once, at most three times, and tells which did. Something
// beside the test can empty the kernel's caches (memory pressure, a
// drop_caches by other work on the machine); a check then holds without
// the manager, which proves nothing either way.
func staleOnce(checks func() map[string]bool, names []string) map[string]bool {
	stale := map[string]bool{}
	for range 3 {
		held := checks()
		done := true
		for _, n := range names {
			if !held[n] {
				stale[n] = true
			}
			done = done && stale[n]
		}
		if done {
			break
		}
	}
	return stale
}

// Random writers through two views at once, each owning its own bytes of
// shared blocks: a partial-block write through one view must never undo
// another's (no lost update).
func TestConcurrentWritersLoseNothing(t *testing.T) {
	v := mountStack(t, "on")
	const size, writers, rounds = 3 * 4096, 4, 300
	os.WriteFile(filepath.Join(v.enc, "shared"), make([]byte, size), 0o644)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Writer w owns offsets ≡ w (mod writers), and writes through
			// enc or r13 by turns; rot13 leaves these bytes alone.
			r := rand.New(rand.NewPCG(uint64(w), 7))
			views := []string{v.enc, v.r13}
			for i := 0; i < rounds; i++ {
				f, err := os.OpenFile(filepath.Join(views[i%2], "shared"), os.O_WRONLY, 0)
				if err != nil {
					t.Error(err)
					return
				}
				off := int64(r.IntN(size/writers)*writers + w)
				f.WriteAt([]byte{byte('0' + w)}, off)
				f.Close()
			}
		}()
	}
	wg.Wait()
	got := []byte(read(filepath.Join(v.enc, "shared")))
	// Replay each writer's offsets to know what it wrote last.
	want := make([]byte, size)
	for w := 0; w < writers; w++ {
		r := rand.New(rand.NewPCG(uint64(w), 7))
		for i := 0; i < rounds; i++ {
			want[r.IntN(size/writers)*writers+w] = byte('0' + w)
		}
	}
	if !bytes.Equal(got, want) {
		lost := 0
		for i := range want {
			if got[i] != want[i] {
				lost++
			}
		}
		t.Errorf("%d of %d bytes lost or wrong after concurrent writes through two views", lost, size)
	}
}
