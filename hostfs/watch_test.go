package hostfs

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// hangGuard bounds every wait for an event; events come in milliseconds.
const hangGuard = 10 * time.Second

// heard collects the events a stack raises.
type heard struct {
	mu   sync.Mutex
	evs  []layer.Event
	more chan struct{} // signalled at each event
}

func hear(n layer.Node) *heard {
	h := &heard{more: make(chan struct{}, 1)}
	n.(*node).fs.st.Events().Subscribe(func(ev layer.Event) {
		h.mu.Lock()
		h.evs = append(h.evs, ev)
		h.mu.Unlock()
		select {
		case h.more <- struct{}{}:
		default:
		}
	})
	return h
}

// seen tells whether ev was raised since the last reset.
func (h *heard) seen(ev layer.Event) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.evs {
		if e == ev {
			return true
		}
	}
	return false
}

func (h *heard) reset() {
	h.mu.Lock()
	h.evs = nil
	h.mu.Unlock()
}

// await waits until every one of want was raised, or fails t.
func (h *heard) await(t *testing.T, what string, want ...layer.Event) {
	t.Helper()
	for deadline := time.After(hangGuard); ; {
		missing := 0
		for _, ev := range want {
			if !h.seen(ev) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-h.more:
		case <-deadline:
			h.mu.Lock()
			t.Fatalf("%s: after %v, %d of the events %v not raised; raised: %v", what, hangGuard, missing, want, h.evs)
		}
	}
}

// tokenOf is the token the FS gives the file at p.
func tokenOf(t *testing.T, n layer.Node, p string) layer.Token {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st); err != nil {
		t.Fatal(err)
	}
	return n.(*node).fs.token(unix.AT_FDCWD, p, &st)
}

// sh runs script in dir as another process: fanotify skips shale's own.
func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
}

// logTo returns a logger and what it logged so far.
func logTo() (*slog.Logger, func() string) {
	var mu sync.Mutex
	var b bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return b.Write(p)
	})
	return slog.New(slog.NewTextHandler(w, nil)), func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Both watchers turn changes another program makes into the same events.
func TestWatchersRaiseChangesBeside(t *testing.T) {
	for _, how := range []string{WatchFanotify, WatchInotify} {
		t.Run(how, func(t *testing.T) {
			dir, root := newFS(t)
			os.WriteFile(filepath.Join(dir, "f"), []byte("1"), 0o644)
			os.Mkdir(filepath.Join(dir, "sub"), 0o755)
			h := watched(t, root, how)
			rootTok := root.Token()
			f := tokenOf(t, root, filepath.Join(dir, "f"))

			sh(t, dir, "echo 2 >> f")
			h.await(t, "write", layer.Event{Kind: layer.Data, Token: f})
			sh(t, dir, "chmod 600 f")
			h.await(t, "chmod", layer.Event{Kind: layer.Attrs, Token: f})
			sh(t, dir, "ln f g")
			h.await(t, "link", layer.Event{Kind: layer.Entries, Token: rootTok, Name: "g"},
				layer.Event{Kind: layer.Attrs, Token: f})
			sh(t, dir, "mv g h")
			h.await(t, "rename", layer.Event{Kind: layer.Entries, Token: rootTok, Name: "g"},
				layer.Event{Kind: layer.Entries, Token: rootTok, Name: "h"})
			sh(t, dir, "rm h")
			h.await(t, "unlink", layer.Event{Kind: layer.Entries, Token: rootTok, Name: "h"})

			// A directory a view has looked up is watched by then.
			sub := lookup(t, root, "sub")
			sh(t, dir, "echo x > sub/i")
			h.await(t, "create and write in a subdirectory",
				layer.Event{Kind: layer.Entries, Token: sub.Token(), Name: "i"},
				layer.Event{Kind: layer.Data, Token: tokenOf(t, root, filepath.Join(dir, "sub/i"))})
			sh(t, dir, "chmod 700 sub")
			h.await(t, "chmod of a directory", layer.Event{Kind: layer.Attrs, Token: sub.Token()})
		})
	}
}

// watched watches root's directory with how until t ends, and hears
// its events.
func watched(t *testing.T, root layer.Node, how string) *heard {
	t.Helper()
	log, _ := logTo()
	stop, err := Watch(root, how, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return hear(root)
}

// untilHeard repeats change until ev is raised: a directory the walk
// watches in the background is watched from some moment on.
func untilHeard(t *testing.T, h *heard, what string, change func(), ev layer.Event) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); !h.seen(ev); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v not raised within %v", what, ev, hangGuard)
		}
		change()
		select {
		case <-h.more:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// inotify watches directories no view has looked up: those there at the
// start, and those that appear, however deep.
func TestInotifyWalks(t *testing.T) {
	dir, root := newFS(t)
	os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755)
	os.WriteFile(filepath.Join(dir, "a/b/c/f"), nil, 0o644)
	log, _ := logTo()
	stop, err := Watch(root, WatchInotify, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	h := hear(root)
	f := filepath.Join(dir, "a/b/c/f")
	untilHeard(t, h, "a file three levels down", func() { os.WriteFile(f, []byte("x"), 0o644) },
		layer.Event{Kind: layer.Data, Token: tokenOf(t, root, f)})

	os.MkdirAll(filepath.Join(dir, "n/m"), 0o755)
	g := filepath.Join(dir, "n/m/g")
	os.WriteFile(g, nil, 0o644)
	untilHeard(t, h, "a file in directories made since", func() { os.WriteFile(g, []byte("x"), 0o644) },
		layer.Event{Kind: layer.Data, Token: tokenOf(t, root, g)})

	// A directory moved in from outside, with what it holds.
	out := t.TempDir()
	os.MkdirAll(filepath.Join(out, "p/q"), 0o755)
	os.WriteFile(filepath.Join(out, "p/q/r"), nil, 0o644)
	if err := os.Rename(filepath.Join(out, "p"), filepath.Join(dir, "p")); err != nil {
		t.Fatal(err)
	}
	r := filepath.Join(dir, "p/q/r")
	untilHeard(t, h, "a file in a directory moved in", func() { os.WriteFile(r, []byte("x"), 0o644) },
		layer.Event{Kind: layer.Data, Token: tokenOf(t, root, r)})
}

// When events are lost, the watcher says so: everything may have changed.
func TestInotifyOverflow(t *testing.T) {
	dir, root := newFS(t)
	f := filepath.Join(dir, "f")
	os.WriteFile(f, nil, 0o644)
	log, _ := logTo()
	stop, err := Watch(root, WatchInotify, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// The reader waits in the first event's delivery while the queue
	// fills beyond fs.inotify.max_queued_events.
	release := make(chan struct{})
	var once sync.Once
	root.(*node).fs.st.Events().Subscribe(func(layer.Event) { once.Do(func() { <-release }) })
	h := hear(root)
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Fatal(err)
	}
	var most int
	fmt.Sscan(string(b), &most)
	fd, err := unix.Open(f, unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Alternate kinds, or the kernel merges them into one.
	for i := 0; i <= most; i++ {
		unix.Pwrite(fd, []byte{1}, 0)
		unix.Fchmod(fd, 0o600|uint32(i%2)<<2)
	}
	close(release)
	h.await(t, "overflow", layer.Event{Kind: layer.Everything})
}

// When watches or descriptors run out, inotify says so once and keeps
// watching what it has; a directory given up the stack takes the watch of
// one only the walk found.
func TestInotifyFull(t *testing.T) {
	dir, root := newFS(t)
	for i := range 8 {
		os.Mkdir(filepath.Join(dir, fmt.Sprint("d", i)), 0o755)
	}
	log, logged := logTo()
	fs := root.(*node).fs
	w, err := fs.newInotify(log)
	if err != nil {
		t.Fatal(err)
	}
	const most = 4 // the root and three of d0..d7
	w.most = most
	if err := w.start(root.(*node)); err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	for deadline := time.Now().Add(hangGuard); !strings.Contains(logged(), "inotify cannot watch"); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning after %v", hangGuard)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.mu.Lock()
	n := len(w.byWd)
	var unwatched string
	for i := range 8 {
		name := fmt.Sprint("d", i)
		if w.byToken[tokenOf(t, root, filepath.Join(dir, name))] == nil {
			unwatched = name
		}
	}
	w.mu.Unlock()
	if n != most || unwatched == "" {
		t.Fatalf("%d watches, want %d, and a directory left without (%q)", n, most, unwatched)
	}
	h := hear(root)
	d := lookup(t, root, unwatched)
	sh(t, dir, "touch "+unwatched+"/x")
	h.await(t, "a file made in a directory looked up after the watches ran out",
		layer.Event{Kind: layer.Entries, Token: d.Token(), Name: "x"})
	// More directories looked up than there are watches: still one warning.
	for i := range 8 {
		lookup(t, root, fmt.Sprint("d", i))
	}
	if k := strings.Count(logged(), "inotify cannot watch"); k != 1 {
		t.Errorf("%d warnings, want 1:\n%s", k, logged())
	}
}
