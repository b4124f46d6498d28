package remote

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
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
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/stack"
)

// exported is shale's own server (export over hostfs) in this process,
// which the client reaches over pipes.
type exported struct {
	dir string
	s   *export.Server
}

func newExported(t *testing.T, opts export.Options) *exported {
	t.Helper()
	x := &exported{dir: t.TempDir()}
	st := stack.New(stack.Options{})
	host, err := hostfs.New(st, x.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Forget)
	opts.NoRootSquash = true
	x.s = export.New(st, map[string]layer.Node{"": host}, opts)
	return x
}

func (x *exported) dial(ctx context.Context) (net.Conn, error) {
	cli, srv := net.Pipe()
	go x.s.ServeConn(srv)
	return cli, nil
}

// proxy is dial with onReply called with the type of each reply before
// the client gets it.
func (x *exported) proxy(onReply func(typ uint8)) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		cli, mid := net.Pipe()
		up, srv := net.Pipe()
		go x.s.ServeConn(srv)
		go func() {
			io.Copy(up, mid)
			up.Close()
		}()
		go func() {
			defer mid.Close()
			for {
				h, body, err := p9wire.ReadFrame(up, 1<<24)
				if err != nil {
					return
				}
				onReply(h.Type)
				e := p9wire.Msg(h.Type, h.Tag)
				e.B = append(e.B, body...)
				if _, err := mid.Write(e.Frame()); err != nil {
					return
				}
			}
		}()
		return cli, nil
	}
}

func mountWith(t *testing.T, dial func(context.Context) (net.Conn, error), opts Options) *node {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	if opts.LostDir == "" {
		opts.LostDir = t.TempDir()
	}
	root, err := newFS(bg, stack.New(stack.Options{}), dial, "pipe", "", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

// A tree of more files than the server lets a connection hold fids: the
// client keeps few idle node fids, so every file can be looked up and
// stated again, and open handles keep theirs.
func TestIdleFids(t *testing.T) {
	const files, maxFids, idle = 500, 64, 16
	x := newExported(t, export.Options{MaxFids: maxFids})
	for i := range files {
		if err := os.WriteFile(filepath.Join(x.dir, fmt.Sprintf("f%03d", i)), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := mountWith(t, x.dial, Options{idleFids: idle})
	nodes := make([]layer.Node, files)
	var handles []layer.Handle
	for i := range nodes {
		nodes[i] = lookup(t, root, fmt.Sprintf("f%03d", i))
		if i%50 == 0 {
			h, e := nodes[i].Open(bg, unix.O_RDONLY)
			must(t, e, "open f%03d", i)
			handles = append(handles, h)
		}
	}
	var a layer.Attr
	for i, n := range nodes {
		must(t, n.Getattr(bg, nil, &a), "stat f%03d again", i)
		if a.Ino != n.Token().Ino {
			t.Fatalf("f%03d: stat gives ino %d, token %d", i, a.Ino, n.Token().Ino)
		}
	}
	c, e := root.fs.ss.Conn(bg)
	must(t, e, "conn")
	if k := c.IdleFids(); k > idle {
		t.Fatalf("%d idle node fids kept, want at most %d", k, idle)
	}
	buf := make([]byte, 10)
	for i, h := range handles {
		k, e := h.Read(bg, buf, 0)
		must(t, e, "read through handle %d", i)
		if string(buf[:k]) != "data" {
			t.Fatalf("handle %d read %q", i, buf[:k])
		}
		must(t, h.Release(bg), "release")
	}
}

// A New that fails after it connected leaves no connection and no dialing
// behind.
func TestNewFailureLeaks(t *testing.T) {
	x := newExported(t, export.Options{})
	before := runtime.NumGoroutine()
	_, err := newFS(bg, stack.New(stack.Options{}), x.dial, "unix:/there", "no/such/tree", Options{Timeout: testTimeout})
	if err == nil {
		t.Fatal("attached a tree that is not there")
	}
	msg := err.Error()
	if !strings.Contains(msg, "9p server at unix:/there") || !strings.Contains(msg, `"no/such/tree"`) || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line naming the server and the tree", msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before New:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// New's errors name the server and say what to do, in one line.
func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	st := stack.New(stack.Options{})
	check := func(err error, want ...string) {
		t.Helper()
		if err == nil {
			t.Fatal("New succeeded")
		}
		msg := err.Error()
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("error %q lacks %q", msg, w)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("error %q is more than one line", msg)
		}
	}

	// Nobody there.
	gone := p9net.Remote{Addr: p9net.Addr{Network: "unix", Address: filepath.Join(dir, "none.sock")}}
	_, err := New(bg, st, gone, Options{Timeout: testTimeout})
	check(err, "9p server at unix:"+gone.Addr.Address+" ", "is it running")

	// A server with a key, a client without.
	x := newExported(t, export.Options{})
	addr := p9net.Addr{Network: "unix", Address: filepath.Join(dir, "keyed.sock")}
	l, err := p9net.Listen(addr, p9net.Key("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	var wg sync.WaitGroup
	wg.Go(func() { x.s.Serve(ctx, l) })
	defer wg.Wait()
	defer cancel()
	// The server takes the request for the start of a TLS record and
	// waits for the rest, until its handshake times out: wait longer.
	_, err = New(bg, st, p9net.Remote{Addr: addr}, Options{Timeout: p9net.HandshakeTimeout + 10*time.Second})
	check(err, "9p server at unix:"+addr.Address+" closed the connection during version negotiation: does it need a key (?keyfile=FILE)?")

	// A tree the server does not have.
	_, err = newFS(bg, st, x.dial, "unix:/x", "nope", Options{Timeout: testTimeout})
	check(err, "9p server at unix:/x ", `"nope"`, "check")
}

// Create's node is the file its handle has open, even when another
// client replaced the name before the client walked it.
func TestCreateReplaced(t *testing.T) {
	x := newExported(t, export.Options{})
	other := filepath.Join(x.dir, "other")
	os.WriteFile(other, []byte("other"), 0o644)
	var once sync.Once
	var armed atomic.Bool // not the journal's Tlcreate, made on connecting
	root := mountWith(t, x.proxy(func(typ uint8) {
		if typ == p9wire.Tlcreate+1 && armed.Load() {
			once.Do(func() { os.Rename(other, filepath.Join(x.dir, "f")) })
		}
	}), Options{})
	armed.Store(true)
	var a layer.Attr
	n, h, e := root.Create(bg, "f", unix.O_RDWR, 0o644, &a)
	must(t, e, "create")
	defer h.Release(bg)
	var ha layer.Attr
	must(t, n.Getattr(bg, h, &ha), "getattr through the handle")
	if n.Token().Ino != ha.Ino || a.Ino != ha.Ino {
		t.Fatalf("node token ino %d, attr ino %d; the open file is ino %d", n.Token().Ino, a.Ino, ha.Ino)
	}
	st, err := os.Stat(filepath.Join(x.dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if ino := st.Sys().(*syscall.Stat_t).Ino; ino == ha.Ino {
		t.Fatalf("the name was not replaced (ino %d): the test tests nothing", ino)
	}
}

// A node whose name was replaced by a rename, or unlinked, does not reach
// what has the name now: it reaches its own file (on servers whose fids
// are files) or fails with ESTALE (on servers whose fids are paths).
func TestReplacedNodes(t *testing.T) {
	run := func(t *testing.T, root *node, dir string) {
		os.WriteFile(filepath.Join(dir, "a"), []byte("A"), 0o644)
		os.WriteFile(filepath.Join(dir, "b"), []byte("BB"), 0o644)
		na, nb := lookup(t, root, "a"), lookup(t, root, "b")
		var a layer.Attr
		must(t, nb.Getattr(bg, nil, &a), "getattr b") // a fid now
		must(t, root.Rename(bg, "a", root, "b", 0), "rename a over b")
		if e := nb.Getattr(bg, nil, &a); e != syscall.ESTALE && (e != 0 || a.Ino != nb.Token().Ino || a.Size != 2) {
			t.Fatalf("replaced node: getattr %v, ino %d size %d; want ESTALE or its own file, ino %d", e, a.Ino, a.Size, nb.Token().Ino)
		}
		must(t, na.Getattr(bg, nil, &a), "getattr of the moved node")
		if a.Ino != na.Token().Ino {
			t.Fatalf("moved node reaches ino %d, is %d", a.Ino, na.Token().Ino)
		}
		// Another link keeps the file's inode number from the new "b".
		if err := os.Link(filepath.Join(dir, "b"), filepath.Join(dir, "keep")); err != nil {
			t.Fatal(err)
		}
		e := root.Unlink(bg, "b")
		if e == syscall.ENOSYS {
			return // hugelgupf/p9's localfs cannot remove
		}
		must(t, e, "unlink")
		os.WriteFile(filepath.Join(dir, "b"), []byte("new"), 0o644)
		if e := na.Getattr(bg, nil, &a); e != syscall.ESTALE && (e != 0 || a.Ino != na.Token().Ino || a.Size != 1) {
			t.Fatalf("unlinked node: getattr %v, ino %d size %d; want ESTALE or its own file, ino %d", e, a.Ino, a.Size, na.Token().Ino)
		}
	}
	t.Run("export", func(t *testing.T) {
		x := newExported(t, export.Options{})
		run(t, mountWith(t, x.dial, Options{}), x.dir)
	})
	servers(t, func(t *testing.T, mk func(t *testing.T) server) {
		srv := mk(t)
		root, _ := mount(t, srv)
		run(t, root, serverDir(srv))
	})
}

func procCount(fs *FS) int {
	fs.procMu.Lock()
	defer fs.procMu.Unlock()
	return len(fs.procs) + len(fs.procIDs)
}

func procID(fs *FS, owner uint64) uint32 {
	fs.procMu.Lock()
	defer fs.procMu.Unlock()
	if p := fs.procs[owner]; p != nil {
		return p.id
	}
	return 0
}

// Lock owners keep a proc_id while they hold locks, and no longer.
func TestLockOwners(t *testing.T) {
	x := newExported(t, export.Options{})
	root := mountWith(t, x.dial, Options{})
	fs := root.fs
	var a layer.Attr
	n, h, e := root.Create(bg, "l", unix.O_RDWR, 0o644, &a)
	must(t, e, "create")
	defer h.Release(bg)
	rng := func(typ uint32, start, end uint64) *layer.Lock {
		return &layer.Lock{Type: typ, Start: start, End: end}
	}
	for o := uint64(1); o <= 100; o++ {
		must(t, h.Setlk(bg, o, rng(syscall.F_WRLCK, o*10, o*10+5), false), "lock of owner %d", o)
	}
	id := procID(fs, 1)
	if id == 0 {
		t.Fatal("owner 1 holds a lock and has no proc_id")
	}
	must(t, h.Setlk(bg, 1, rng(syscall.F_WRLCK, 2000, 2005), false), "second lock")
	must(t, h.Setlk(bg, 1, rng(syscall.F_UNLCK, 10, 15), false), "partial unlock")
	if got := procID(fs, 1); got != id {
		t.Fatalf("owner 1 still holds a lock: proc_id %d, was %d", got, id)
	}
	for o := uint64(1); o <= 100; o++ {
		must(t, h.Flush(bg, o), "flush of owner %d", o)
	}
	if k := procCount(fs); k != 0 {
		t.Fatalf("%d proc entries after every owner closed", k)
	}

	// An unlock of the whole file; a failed lock; Getlk.
	must(t, h.Setlk(bg, 5, rng(syscall.F_RDLCK, 0, 9), false), "lock")
	must(t, h.Setlk(bg, 5, rng(syscall.F_UNLCK, 0, math.MaxUint64), false), "unlock all")
	lk := rng(syscall.F_WRLCK, 0, math.MaxUint64)
	must(t, h.Getlk(bg, 6, lk), "getlk")
	if k := procCount(fs); k != 0 {
		t.Fatalf("%d proc entries after unlock and getlk", k)
	}

	// flock: unlock, and release of the handle.
	fl := func(typ uint32) *layer.Lock { return &layer.Lock{Type: typ, End: math.MaxUint64, Flock: true} }
	must(t, h.Setlk(bg, 7, fl(syscall.F_WRLCK), false), "flock")
	if procID(fs, 7) == 0 {
		t.Fatal("flock owner has no proc_id")
	}
	must(t, h.Setlk(bg, 7, fl(syscall.F_UNLCK), false), "flock unlock")
	h2, e := n.Open(bg, unix.O_RDWR)
	must(t, e, "open")
	must(t, h2.Setlk(bg, 8, fl(syscall.F_RDLCK), false), "flock 2")
	must(t, h2.Setlk(bg, 9, rng(syscall.F_RDLCK, 0, 0), false), "lock through the second handle")
	if e := h.Setlk(bg, 10, fl(syscall.F_WRLCK), false); e != syscall.EAGAIN {
		t.Fatalf("conflicting flock: %v", e)
	}
	must(t, h2.Release(bg), "release")
	if k := procCount(fs); k != 0 {
		t.Fatalf("%d proc entries after flock unlock and release", k)
	}
}
