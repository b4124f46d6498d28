package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// spriteServer is shale's server in this process over pipes that a test
// can cut (a crash of the server, or of the network) and start again
// with a new server on the same directory (a restart).
type spriteServer struct {
	dir  string
	opts export.Options

	mu    sync.Mutex
	s     *export.Server
	down  map[string]bool // the clients whose dials fail
	conns map[string][]net.Conn
	// lose, if not 0, is a reply type the server makes but that never
	// reaches the client: its connection breaks instead (once).
	lose atomic.Uint32
	// hold, if not 0, is a reply type that waits for held to close,
	// while the replies after it go on.
	hold    atomic.Uint32
	held    chan struct{}
	holding atomic.Int32 // replies hold has kept so far
}

func newSpriteServer(t *testing.T, opts export.Options) *spriteServer {
	if opts.RightsFile == "" {
		opts.RightsFile = filepath.Join(t.TempDir(), "rights") // what a restart's reclaims are checked against
	}
	x := &spriteServer{dir: t.TempDir(), opts: opts, down: map[string]bool{}, conns: map[string][]net.Conn{}}
	x.restart(t, 0)
	return x
}

// restart cuts every connection and serves with a new server (new epoch,
// no state), with grace.
func (x *spriteServer) restart(t *testing.T, grace time.Duration) {
	t.Helper()
	st := stack.New(stack.Options{})
	host, err := hostfs.New(st, x.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Forget)
	opts := x.opts
	opts.NoRootSquash, opts.Grace, opts.Sprite = true, grace, true
	x.mu.Lock()
	x.s = export.New(st, map[string]layer.Node{"": host}, opts)
	x.mu.Unlock()
	x.cut("") // after: a client that redials at once reaches the new one
}

// cut closes the connections of client who, or of all ("").
func (x *spriteServer) cut(who string) {
	x.mu.Lock()
	var cs []net.Conn
	for w, wcs := range x.conns {
		if who == "" || w == who {
			cs = append(cs, wcs...)
			delete(x.conns, w)
		}
	}
	x.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (x *spriteServer) setDown(who string, down bool) {
	x.mu.Lock()
	x.down[who] = down
	x.mu.Unlock()
}

// dialer is how client who connects.
func (x *spriteServer) dialer(who string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.down[who] {
			return nil, errors.New("down")
		}
		cli, srv := net.Pipe()
		x.conns[who] = append(x.conns[who], cli, srv)
		go x.s.ServeConn(&losing{Conn: srv, x: x})
		return cli, nil
	}
}

// losing is a server's end of a pipe that breaks instead of sending the
// reply x.lose names.
type losing struct {
	net.Conn
	x *spriteServer
}

func (l *losing) Write(b []byte) (int, error) {
	if t := l.x.hold.Load(); len(b) > 4 && t != 0 && uint32(b[4]) == t {
		late, held := slices.Clone(b), l.x.held
		l.x.holding.Add(1)
		go func() {
			<-held
			l.Conn.Write(late)
		}()
		return len(b), nil
	}
	if t := l.x.lose.Load(); len(b) > 4 && t != 0 && uint32(b[4]) == t && l.x.lose.CompareAndSwap(t, 0) {
		l.Conn.Close()
		return 0, net.ErrClosed
	}
	return l.Conn.Write(b)
}

// onServer is what the server's directory holds of name.
func (x *spriteServer) onServer(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(x.dir, name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// spriteClient mounts x as client who, with writes delayed for an hour
// unless opts say.
func spriteClient(t *testing.T, x *spriteServer, who string, opts Options) *node {
	t.Helper()
	if opts.WriteDelay == 0 {
		opts.WriteDelay = time.Hour
	}
	n := mountWith(t, x.dialer(who), opts)
	for deadline := time.Now().Add(slow); !n.fs.wb.Sprite(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client never learnt the server follows Sprite's rules")
		}
	}
	return n
}

func create(t *testing.T, dir layer.Node, name string) (layer.Node, layer.Handle) {
	t.Helper()
	var a layer.Attr
	n, h, e := dir.Create(bg, name, unix.O_RDWR|unix.O_TRUNC, 0o644, &a)
	must(t, e, "create %s", name)
	return n, h
}

func open(t *testing.T, n layer.Node, flags uint32) layer.Handle {
	t.Helper()
	h, e := n.Open(bg, flags)
	must(t, e, "open")
	return h
}

func write(t *testing.T, h layer.Handle, off int64, s string) {
	t.Helper()
	if k, e := h.Write(bg, []byte(s), off); e != 0 || k != len(s) {
		t.Fatalf("write %q at %d: %d %v", s, off, k, e)
	}
}

func readAll(t *testing.T, h layer.Handle) string {
	t.Helper()
	buf := make([]byte, 1<<16)
	k, e := h.Read(bg, buf, 0)
	must(t, e, "read")
	return string(buf[:k])
}

func size(t *testing.T, n layer.Node) uint64 {
	t.Helper()
	var a layer.Attr
	must(t, n.Getattr(bg, nil, &a), "getattr")
	return a.Size
}

// Written data stays on the client, seen by its reads and stat, until an
// fsync sends it; a write over delayed data replaces it before it is
// ever sent.
func TestDelayedWrite(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	f, h := create(t, a, "f")
	write(t, h, 0, "hello world")
	write(t, h, 6, "there")
	write(t, h, 20, "!") // past the end: a hole between
	if got := x.onServer(t, "f"); got != "" {
		t.Fatalf("the server has %q before any write-back", got)
	}
	want := "hello there" + strings.Repeat("\x00", 9) + "!"
	if got := readAll(t, h); got != want {
		t.Fatalf("read %q, want %q", got, want)
	}
	if s := size(t, f); s != uint64(len(want)) {
		t.Fatalf("size %d, want %d", s, len(want))
	}
	var before layer.Attr
	must(t, f.Getattr(bg, nil, &before), "getattr")
	time.Sleep(10 * time.Millisecond) // a write-back's own time would differ
	must(t, h.Fsync(bg, false), "fsync")
	if got := x.onServer(t, "f"); got != want {
		t.Fatalf("after fsync the server has %q, want %q", got, want)
	}
	// The modification time is the last write's, not the write-back's
	// (make compares them).
	if fi, err := os.Stat(filepath.Join(x.dir, "f")); err != nil || !fi.ModTime().Equal(before.Mtime) {
		t.Fatalf("after fsync the server's mtime is %v, the client showed %v (%v)", fi.ModTime(), before.Mtime, err)
	}
	st := a.fs.Stats().Sprite
	if st.Discarded != 5 || st.WriteBacks["fsync"] != 1 || st.DirtyBytes != 0 {
		t.Fatalf("stats: %+v", st)
	}
	// Truncating drops delayed bytes, and they are never sent.
	write(t, h, 0, "HELLO")
	var out layer.Attr
	must(t, f.Setattr(bg, h, &layer.SetAttr{Valid: layer.SetSize, Size: 2}, &out), "truncate")
	if got := readAll(t, h); got != "HE" || out.Size != 2 {
		t.Fatalf("after truncate: %q, size %d", got, out.Size)
	}
	h.Release(bg)
	a.Close()
	if got := x.onServer(t, "f"); got != "HE" {
		t.Fatalf("after unmount the server has %q", got)
	}
}

// A file made, written and removed within the delay never reaches the
// server.
func TestTempFileNeverSent(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	_, h := create(t, a, "tmp")
	data := bytes.Repeat([]byte("x"), 1<<20)
	if _, e := h.Write(bg, data, 0); e != 0 {
		t.Fatal(e)
	}
	h.Release(bg)
	must(t, a.Unlink(bg, "tmp"), "unlink")
	st := a.fs.Stats().Sprite
	if st.WriteServerBytes != 0 || st.Discarded != 1<<20 || st.DirtyBytes != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// Sequential write sharing: B's open makes the server recall A's
// delayed writes first, so B reads them.
func TestRecall(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "from a")
	h.Release(bg)
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDONLY)
	defer hb.Release(bg)
	if got := readAll(t, hb); got != "from a" {
		t.Fatalf("b read %q, want a's delayed write", got)
	}
	if st := a.fs.Stats().Sprite; st.Recalls != 1 || st.WriteBacks["recall"] != 1 {
		t.Fatalf("a's stats: %+v", st)
	}
	// A's next open finds the version it knows: its cache stays.
	fa := lookup(t, a, "f")
	open(t, fa, unix.O_RDONLY).Release(bg)
	if st := a.fs.Stats().Sprite; st.OpensStale != 0 {
		t.Fatalf("a's own write made its next open stale: %+v", st)
	}
	// B writes: A's next open finds another version and drops its data.
	hw := open(t, fb, unix.O_WRONLY)
	write(t, hw, 0, "FROM B")
	must(t, hw.Fsync(bg, false), "fsync")
	hw.Release(bg)
	ha := open(t, fa, unix.O_RDONLY)
	defer ha.Release(bg)
	if got := readAll(t, ha); got != "FROM B" {
		t.Fatalf("a read %q after b's write", got)
	}
	if st := a.fs.Stats().Sprite; st.OpensStale != 1 {
		t.Fatalf("a's stats: %+v", st)
	}
}

// Concurrent write sharing: with the file open on both clients and one
// writing, neither caches it; interleaved writes from both read as one
// machine's would.
func TestConcurrentSharing(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	fa, ha := create(t, a, "f")
	write(t, ha, 0, "aaaa") // delayed, before the sharing
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDWR)
	want := []byte("aaaa")
	for i := range 8 {
		h, c := ha, byte('A'+i)
		if i%2 == 1 {
			h = hb
		}
		off := int64(2 * i)
		write(t, h, off, string([]byte{c, c}))
		for len(want) < int(off)+2 {
			want = append(want, 0)
		}
		copy(want[off:], []byte{c, c})
		for _, r := range []layer.Handle{ha, hb} {
			if got := readAll(t, r); got != string(want) {
				t.Fatalf("step %d: read %q, want %q", i, got, want)
			}
		}
	}
	if got := x.onServer(t, "f"); got != string(want) {
		t.Fatalf("the server has %q, want %q", got, want)
	}
	if st := a.fs.Stats().Sprite; st.Uncaches != 1 {
		t.Fatalf("a's stats: %+v", st)
	}
	if st := b.fs.Stats().Sprite; st.OpensNoCache != 1 {
		t.Fatalf("b's stats: %+v", st)
	}
	ha.Release(bg)
	hb.Release(bg)
	_ = fa
}

// A write to a write-shared file returns once every other client that
// caches the file applied its record, not only the sharers: a client
// that closed it but kept its attributes (the RELEASE of its last read
// had not reached the server when the writer opened it again) must not
// show the old size after the writer's close (issue 23).
func TestSharedWriteSeenByFollower(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	c := spriteClient(t, x, "c", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "v1")
	must(t, h.Release(bg), "release")
	fc := lookup(t, c, "f")
	if got := size(t, fc); got != 2 {
		t.Fatalf("c's stat: size %d, want 2", got)
	}
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDONLY)
	defer hb.Release(bg)
	fa := lookup(t, a, "f")
	for v := 2; v < 300; v++ {
		ha := open(t, fa, unix.O_RDWR) // write-shared with b: through
		s := fmt.Sprintf("v%d:%s", v, strings.Repeat(".", v))
		write(t, ha, 0, s)
		must(t, ha.Release(bg), "release")
		if got := size(t, fc); got != uint64(len(s)) {
			t.Fatalf("version %d: c's stat after a's write returned: size %d, want %d", v, got, len(s))
		}
	}
}

// Data dirty for the delay is written back by itself.
func TestWriteBackAge(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{WriteDelay: 100 * time.Millisecond})
	_, h := create(t, a, "f")
	write(t, h, 0, "aged")
	h.Release(bg)
	for deadline := time.Now().Add(slow); x.onServer(t, "f") != "aged"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never written back")
		}
	}
}

// A restarted server learns a client's dirty files from its reclaim;
// within the grace, another client's open waits for it and reads them,
// with the times the owner set meanwhile (kept with the data).
func TestReclaimAfterRestart(t *testing.T) {
	x, a, f := delayedFile(t, "before the crash")
	mtime := time.Date(2002, 3, 4, 5, 6, 7, 8000, time.UTC)
	keptUtimes(t, a, f, time.Time{}, mtime)
	x.restart(t, time.Minute)
	b := spriteClient(t, x, "b", Options{})
	fb := lookup(t, b, "f")
	hb := open(t, fb, unix.O_RDONLY) // recalls a's reclaimed data
	defer hb.Release(bg)
	if got := readAll(t, hb); got != "before the crash" {
		t.Fatalf("b read %q", got)
	}
	var at layer.Attr
	must(t, fb.Getattr(bg, hb, &at), "stat on b")
	if !at.Mtime.Equal(mtime) {
		t.Fatalf("b sees mtime %v, want the one a set, %v", at.Mtime, mtime)
	}
}

// A client cut off past its lease loses the files another client wrote
// meanwhile: its write-back is refused, said once in the log, and its
// next fsync fails with EIO.
func TestRefusedWriteBack(t *testing.T) {
	x := newSpriteServer(t, export.Options{Lease: 50 * time.Millisecond})
	var logb syncBuf
	a := spriteClient(t, x, "a", Options{Logger: slog.New(slog.NewTextHandler(&logb, nil))})
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, a, "f")
	write(t, h, 0, "a's")
	x.setDown("a", true)
	x.cut("a")
	fb := lookup(t, b, "f")
	hw := open(t, fb, unix.O_WRONLY) // waits out a's lease
	write(t, hw, 0, "b's")
	must(t, hw.Fsync(bg, false), "fsync")
	hw.Release(bg)
	x.setDown("a", false)
	if e := h.Fsync(bg, false); e != syscall.EIO {
		t.Fatalf("a's fsync: %v, want EIO", e)
	}
	if e := h.Fsync(bg, false); e != 0 {
		t.Fatalf("a's second fsync: %v, want 0 (told once)", e)
	}
	h.Release(bg)
	if got := x.onServer(t, "f"); got != "b's" {
		t.Fatalf("the server has %q", got)
	}
	if n := strings.Count(logb.String(), "kept in a conflict copy"); n != 1 {
		t.Fatalf("%d log lines about the loss:\n%s", n, logb.String())
	}
	copies, _ := filepath.Glob(filepath.Join(a.fs.wb.LostDir, "pipe", "f.*"))
	if len(copies) != 1 {
		t.Fatalf("conflict copies: %v, want one", copies)
	}
	if b, err := os.ReadFile(copies[0]); err != nil || string(b) != "a's" {
		t.Fatalf("the conflict copy holds %q (%v), want a's bytes", b, err)
	}
	if got := a.fs.wb.Ctr.Lost.Load(); got != 3 || a.fs.wb.Ctr.Discarded.Load() != 0 {
		t.Fatalf("lost %d, discarded %d bytes; want 3 lost, none discarded", got, a.fs.wb.Ctr.Discarded.Load())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A recall racing a close: B opens while A is closing a file it just
// wrote; B's open, once A's close returned, reads A's bytes.
func TestRecallRacingClose(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	b := spriteClient(t, x, "b", Options{})
	_, h := create(t, a, "f")
	h.Release(bg)
	fa, fb := lookup(t, a, "f"), lookup(t, b, "f")
	for i := range 50 {
		want := strings.Repeat(string(rune('a'+i%26)), 1+i)
		h := open(t, fa, unix.O_WRONLY|unix.O_TRUNC)
		write(t, h, 0, want)
		closed := make(chan struct{})
		go func() {
			h.Flush(bg, 1)
			h.Release(bg)
			close(closed)
		}()
		// An open racing the close: it sees the old or the new bytes,
		// whole.
		hb := open(t, fb, unix.O_RDONLY)
		got := readAll(t, hb)
		hb.Release(bg)
		if got != want && len(got) != i {
			t.Fatalf("round %d: an open racing the close read %q", i, got)
		}
		<-closed
		hb = open(t, fb, unix.O_RDONLY)
		if got := readAll(t, hb); got != want {
			t.Fatalf("round %d: after the close b read %q, want %q", i, got, want)
		}
		hb.Release(bg)
	}
}

// An fsync racing write-backs by age: every record acknowledged by an
// fsync is on the server then, in order, whatever write-back ran.
func TestFsyncRacingWriteBack(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{WriteDelay: time.Millisecond})
	_, h := create(t, a, "log")
	defer h.Release(bg)
	var want strings.Builder
	for i := range 200 {
		rec := strings.Repeat(string(rune('A'+i%26)), 1+i%37) + "\n"
		write(t, h, int64(want.Len()), rec)
		want.WriteString(rec)
		if i%3 == 0 {
			must(t, h.Fsync(bg, false), "fsync")
			if got := x.onServer(t, "log"); !strings.HasPrefix(got, want.String()) {
				t.Fatalf("record %d: after fsync the server has %d bytes, not the %d acknowledged", i, len(got), want.Len())
			}
		}
	}
}

// A client with nothing dirty says so of itself (a Clean of its own):
// written through, or written back by fsync, and closed, the file opens
// elsewhere without a recall.
func TestNoRecallWhenClean(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{{"through", -1}, {"fsynced", time.Hour}} {
		a := spriteClient(t, x, "a-"+c.name, Options{WriteDelay: c.delay})
		b := spriteClient(t, x, "b-"+c.name, Options{})
		_, h := create(t, a, c.name)
		write(t, h, 0, "data")
		must(t, h.Fsync(bg, false), "fsync")
		h.Release(bg)
		// The Clean goes in the background: once the server has it, b's
		// open recalls nothing.
		for deadline := time.Now().Add(slow); a.fs.Stats().Sprite.Cleans == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a never said it is clean", c.name)
			}
		}
		hb := open(t, lookup(t, b, c.name), unix.O_RDONLY)
		if got := readAll(t, hb); got != "data" {
			t.Fatalf("%s: b read %q", c.name, got)
		}
		hb.Release(bg)
		if n := a.fs.Stats().Sprite.Recalls; n != 0 {
			t.Fatalf("%s: b's open recalled from a, which had nothing dirty (%d recalls)", c.name, n)
		}
	}
}
