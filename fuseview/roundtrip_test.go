package fuseview

import (
	"bytes"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/hostfs"
)

// The round trips a coherent view skips (docs/coherence.md): the tests
// of each check that the request is gone, and that a change made beside
// shale, in LOWER by another process, still shows through the mount
// after it; and one tried and taken back (FLUSH) has the test it failed.

// requests counts the FUSE requests a mount receives, by opcode, from
// go-fuse's debug log.
type requests struct {
	mu  sync.Mutex
	n   map[string]int
	buf []byte
}

var rxLine = regexp.MustCompile(`rx \d+: ([A-Z_]+)`)

func (r *requests) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	for {
		i := bytes.IndexByte(r.buf, '\n')
		if i < 0 {
			break
		}
		if m := rxLine.FindSubmatch(r.buf[:i]); m != nil {
			r.n[string(m[1])]++
		}
		r.buf = r.buf[i+1:]
	}
	return len(p), nil
}

// since returns the counts since the last call.
func (r *requests) since() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.n
	r.n = map[string]int{}
	return n
}

// coherentMount mounts a new lower directory as shale mount does as root:
// coherent, hour-long caches, the page cache kept, LOWER watched with
// fanotify; with views > 1 as shale mount --stack does, several views of
// the stack. Their requests are counted together.
func coherentMount(t *testing.T, passthrough bool, views int) (lower string, mnts []string, reqs *requests) {
	lower, st, root := hostStack(t)
	stop, err := hostfs.Watch(root, hostfs.WatchFanotify, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	reqs = &requests{n: map[string]int{}}
	log.SetOutput(reqs)
	var srvs []*fuse.Server
	t.Cleanup(func() {
		stop()
		for i, srv := range srvs {
			if err := srv.Unmount(); err != nil {
				t.Errorf("unmount %s: %v", mnts[i], err)
			}
		}
		log.SetOutput(os.Stderr)
		root.Forget()
	})
	for range views {
		mnt := t.TempDir()
		srv, err := Mount(mnt, st, root, Options{Timeout: time.Hour, AllowOther: true, Passthrough: passthrough,
			Coherent: true, KeepCache: true, Source: lower, Debug: true})
		if err != nil {
			t.Fatal(err)
		}
		mnts, srvs = append(mnts, mnt), append(srvs, srv)
	}
	return lower, mnts, reqs
}

// beside runs a shell command in another process: fanotify skips changes
// made by the process serving the mount, which shale made itself.
func beside(t *testing.T, script string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v %s", script, err, out)
	}
}

// eventually polls cond until it holds, for a generous while: the watch
// tells the view a moment after the change.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after 10s", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cachedSoon checks that do costs none of the requests ops once the
// kernel caches what it asks for: it repeats do until a pass sends none.
// The watch tells the view of the setup's changes a moment after they
// are made, and a LOOKUP such news raced is not kept long (node.go).
func cachedSoon(t *testing.T, reqs *requests, what string, do func(), ops ...string) {
	t.Helper()
	eventually(t, what, func() (bool, string) {
		reqs.since()
		do()
		n := reqs.since()
		for _, op := range ops {
			if n[op] != 0 {
				return false, fmt.Sprintf("costing %v", n)
			}
		}
		return true, ""
	})
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, e := range es {
		ns = append(ns, e.Name())
	}
	return ns
}

// Listings: no OPENDIR or RELEASEDIR, and no READDIR once the kernel
// keeps the listing; names made and removed in LOWER still show.
func TestNoOpendir(t *testing.T) {
	lower, mnts, reqs := coherentMount(t, true, 1)
	mnt := mnts[0]
	beside(t, "mkdir "+lower+"/d && echo a >"+lower+"/d/a")
	d := filepath.Join(mnt, "d")
	if got := names(t, d); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("listing: %v", got)
	}
	cachedSoon(t, reqs, "a listing the kernel keeps", func() { names(t, d) }, "OPENDIR", "RELEASEDIR", "READDIR", "READDIRPLUS")
	beside(t, "echo b >"+lower+"/d/b && rm "+lower+"/d/a")
	eventually(t, "listing after b made and a removed in LOWER", func() (bool, string) {
		got := names(t, d)
		return slices.Equal(got, []string{"b"}), fmt.Sprintf("listing %v", got)
	})
}

const lockHelperEnv = "FUSEVIEW_TEST_LOCK"

// lockChild tries a POSIX write lock on all of path, prints OK or the
// error, and exits.
func lockChild(path string) {
	f, err := os.NewFile(3, "inherited"), error(nil)
	if path != inheritedFd {
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err == nil {
		err = unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK})
	}
	if err != nil {
		fmt.Println(err)
	} else {
		fmt.Println("OK")
	}
	os.Exit(0)
}

// inheritedFd tells lockChild to lock its descriptor 3, an open file it
// shares with its parent.
const inheritedFd = "fd3"

// otherLocks reports whether another process may lock all of path now.
func otherLocks(t *testing.T, path string) string {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), lockHelperEnv+"="+path)
	out, err := c.Output()
	if err != nil {
		t.Fatalf("locking child: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// A name found missing is asked for once; made in LOWER by another
// process, or through another view of the stack, it shows.
func TestNegativeEntries(t *testing.T) {
	lower, mnts, reqs := coherentMount(t, true, 2)
	a, b := mnts[0], mnts[1]
	missing := func(p string) bool {
		_, err := os.Lstat(p)
		return os.IsNotExist(err)
	}
	for _, name := range []string{"x", "y"} {
		if !missing(filepath.Join(a, name)) {
			t.Fatalf("%s: not missing", name)
		}
	}
	cachedSoon(t, reqs, "a name found missing before", func() { missing(filepath.Join(a, "x")) }, "LOOKUP")
	beside(t, "echo x >"+lower+"/x")
	eventually(t, "a name made in LOWER", func() (bool, string) {
		return !missing(filepath.Join(a, "x")), "missing"
	})
	// Through another view: seen once the create returned.
	if err := os.WriteFile(filepath.Join(b, "y"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if missing(filepath.Join(a, "y")) {
		t.Error("a name made through another view is missing in the first")
	}
}

// A symlink's target is read once (FUSE_CACHE_SYMLINKS): a symlink never
// changes in place, and one replaced in LOWER is a new file, which shows.
func TestSymlinkCache(t *testing.T) {
	lower, mnts, reqs := coherentMount(t, true, 1)
	beside(t, "ln -s old "+lower+"/l")
	p := filepath.Join(mnts[0], "l")
	target := func() string {
		s, err := os.Readlink(p)
		if err != nil {
			return err.Error()
		}
		return s
	}
	if got := target(); got != "old" {
		t.Fatalf("readlink: %s", got)
	}
	cachedSoon(t, reqs, "a symlink read before", func() { target() }, "READLINK")
	beside(t, "ln -sfn new "+lower+"/l")
	eventually(t, "a symlink replaced in LOWER", func() (bool, string) {
		got := target()
		return got == "new", got
	})
}

// Listings with no OPENDIR go on through the view's own handles, shared
// and reopened: readers listing one large directory at once, and one
// that stops halfway, each see every name.
func TestNoOpendirListingsAtOnce(t *testing.T) {
	lower, mnts, _ := coherentMount(t, true, 1)
	const n = 3000
	beside(t, "mkdir "+lower+"/d && cd "+lower+"/d && seq "+fmt.Sprint(n)+" | xargs touch")
	d := filepath.Join(mnts[0], "d")
	// One stops halfway: its handle is left to the others.
	f, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadDir(100); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([]int, 4)
	for i := range got {
		wg.Go(func() {
			es, err := os.ReadDir(d)
			if err != nil {
				t.Error(err)
			}
			got[i] = len(es)
		})
	}
	wg.Wait()
	rest, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, 100+len(rest))
	for i, k := range got {
		if k != n {
			t.Errorf("listing %d: %d names, want %d", i, k, n)
		}
	}
}

// A process's POSIX locks go when it exits, although its parent still
// has the open file it locked through: close(2) at exit sends FLUSH,
// with the child's lock owner. With FOPEN_NOFLUSH they stayed until the
// parent closed it too (stress-ng's lockf stressor hung on them).
func TestLocksGoWithTheirProcess(t *testing.T) {
	_, mnts, _ := coherentMount(t, true, 1)
	p := filepath.Join(mnts[0], "f")
	if err := os.WriteFile(p, []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), lockHelperEnv+"="+inheritedFd)
	c.ExtraFiles = []*os.File{f}
	if out, err := c.Output(); err != nil || strings.TrimSpace(string(out)) != "OK" {
		t.Fatalf("child locking the shared file: %q %v", out, err)
	}
	if got := otherLocks(t, p); got != "OK" {
		t.Errorf("another process after the locking child exited: %s", got)
	}
}
