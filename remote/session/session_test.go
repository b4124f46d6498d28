package session

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/stack"
)

// server is shale's own 9P server on a temporary directory, in this
// process, over pipes the test can cut or refuse to make.
type server struct {
	dir string
	s   *export.Server

	mu    sync.Mutex
	down  bool
	conns []net.Conn
	dials int
}

func newServer(t *testing.T) *server {
	t.Helper()
	x := &server{dir: t.TempDir()}
	st := stack.New(stack.Options{})
	host, err := hostfs.New(st, x.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Forget)
	x.s = export.New(st, map[string]layer.Node{"": host}, export.Options{NoRootSquash: true})
	t.Cleanup(x.cut)
	return x
}

func (x *server) dial(ctx context.Context) (net.Conn, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.dials++
	if x.down {
		return nil, errors.New("down")
	}
	cli, srv := net.Pipe()
	x.conns = append(x.conns, cli, srv)
	go x.s.ServeConn(srv)
	return cli, nil
}

// cut closes every connection made so far.
func (x *server) cut() {
	x.mu.Lock()
	cs := x.conns
	x.conns = nil
	x.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (x *server) dialed() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.dials
}

func (x *server) setDown(down bool) {
	x.mu.Lock()
	x.down = down
	x.mu.Unlock()
}

func opts(timeout time.Duration) ConnOptions {
	return ConnOptions{Msize: 64 << 10, Timeout: timeout, MaxIdle: 8,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Ctr: &Counters{}}
}

// newConn waits, within a generous bound, for s's connection.
func newConn(t *testing.T, s *Session) *Conn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, e := s.Conn(context.Background())
		if e == 0 {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection: %v", e)
		}
	}
}

// Every connection, the first and each redial, runs the steps in the
// order they were added before it serves, and each loss is told first.
func TestStepsOnEveryConnection(t *testing.T) {
	x := newServer(t)
	s := New(x.dial, opts(5*time.Second))
	defer s.Close()
	var mu sync.Mutex
	var ran []string
	for _, what := range []string{"journal", "reclaim"} {
		s.Then(what, func(c *Conn) error {
			if _, err := c.Root(Who(Cred{Uid: 0, Plain: true})); err != nil { // the step may use the connection
				return err
			}
			mu.Lock()
			ran = append(ran, what)
			mu.Unlock()
			return nil
		})
	}
	lost := make(chan *Conn, 4)
	s.OnLost(func(c *Conn) { lost <- c })
	first, err := s.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x.cut()
	if got := <-lost; got != first {
		t.Fatalf("told of the loss of %p, want the first connection %p", got, first)
	}
	second := newConn(t, s)
	if second == first || !second.Alive() || first.Alive() {
		t.Fatalf("after the cut: first alive %v, second %p alive %v", first.Alive(), second, second.Alive())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"journal", "reclaim", "journal", "reclaim"}; !slices.Equal(ran, want) {
		t.Fatalf("steps ran %v, want %v", ran, want)
	}
}

// A step that fails fails Start with one line that says which; on a
// redial, it ends that connection and the session dials again.
func TestStepFails(t *testing.T) {
	x := newServer(t)
	s := New(x.dial, opts(5*time.Second))
	defer s.Close()
	var mu sync.Mutex
	fails := 1
	step := func(c *Conn) error { // fails as often as fails says
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			return syscall.EIO
		}
		return nil
	}
	s.Then("opening the journal", step)
	_, err := s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "while opening the journal") {
		t.Fatalf("Start: %v, want the failing step named", err)
	}
	s2 := New(x.dial, opts(5*time.Second))
	defer s2.Close()
	s2.Then("opening the journal", step)
	lost := make(chan *Conn, 4)
	s2.OnLost(func(c *Conn) { lost <- c })
	if _, err := s2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	fails = 2 // the next two redials fail their step
	mu.Unlock()
	before := x.dialed()
	x.cut()
	<-lost
	c := newConn(t, s2)
	if !c.Alive() || x.dialed() < before+3 {
		t.Fatalf("alive %v after %d dials, want 3 at least", c.Alive(), x.dialed()-before)
	}
}

// With the server unreachable a request waits for a connection up to the
// timeout, then fails with EIO; once it is back, the next one gets the
// new connection. A context that ends first is EINTR.
func TestConnWaitsForRedial(t *testing.T) {
	x := newServer(t)
	s := New(x.dial, opts(300*time.Millisecond))
	defer s.Close()
	lost := make(chan *Conn, 4)
	s.OnLost(func(c *Conn) { lost <- c })
	if _, err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	x.setDown(true)
	x.cut()
	<-lost
	if _, e := s.Conn(context.Background()); e != syscall.EIO {
		t.Fatalf("Conn with the server down: %v, want EIO", e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, e := s.Conn(ctx); e != syscall.EINTR {
		t.Fatalf("Conn with its context ended: %v, want EINTR", e)
	}
	x.setDown(false)
	if c := newConn(t, s); !c.Alive() {
		t.Fatal("the new connection is dead")
	}
	s.Close()
	if _, e := s.Conn(context.Background()); e != syscall.EIO {
		t.Fatalf("Conn after Close: %v, want EIO", e)
	}
}

// UntilNotLost sends again what a lost connection took, as often as need
// be within the timeout and maxResends times past it; a try that was not
// lost is the last.
func TestUntilNotLost(t *testing.T) {
	x := newServer(t)
	timeout := 200 * time.Millisecond
	s := New(x.dial, opts(timeout))
	defer s.Close()
	if _, err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tries := 0
	s.UntilNotLost(context.Background(), func() bool { tries++; return tries < 3 })
	if tries != 3 {
		t.Fatalf("%d tries, want 3 (the third was not lost)", tries)
	}
	tries = 0
	start := time.Now()
	s.UntilNotLost(context.Background(), func() bool { tries++; return true })
	if tries < maxResends+1 || time.Since(start) < timeout {
		t.Fatalf("always lost: %d tries in %v, want %d at least and the timeout", tries, time.Since(start), maxResends+1)
	}
	// A try that took its whole timeout (a stalled link) is still sent
	// again, maxResends times.
	tries = 0
	s.UntilNotLost(context.Background(), func() bool { tries++; time.Sleep(timeout); return true })
	if tries != maxResends+1 {
		t.Fatalf("slow and lost: %d tries, want %d", tries, maxResends+1)
	}
}

// The typed requests against a real server: attach, walk, create by
// open, reads and writes split at the message size, attributes, and a
// fid that is free again after a failed walk.
func TestTypedRequests(t *testing.T) {
	x := newServer(t)
	os.MkdirAll(filepath.Join(x.dir, "d", "e"), 0o755)
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB: five 64 KiB messages at least
	os.WriteFile(filepath.Join(x.dir, "d", "e", "f"), nil, 0o644)
	o := opts(5 * time.Second)
	s := New(x.dial, o)
	defer s.Close()
	c, err := s.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	root, err := c.Root(Who(Cred{Uid: 0, Plain: true}))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Root(Who(Cred{Uid: 0, Plain: true})); again != root {
		t.Fatalf("a second Root attached again: fid %d, then %d", root, again)
	}
	if _, _, err := c.Walk(root, []string{"d", "missing"}); err != syscall.ENOENT {
		t.Fatalf("walk to a missing name: %v, want ENOENT", err)
	}
	fid, q, err := c.Walk(root, []string{"d", "e", "f"})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(x.dir, "d", "e", "f"), &st)
	if q.Path != st.Ino {
		t.Fatalf("walk's QID path %d, the file's inode %d", q.Path, st.Ino)
	}
	if _, _, err := c.Lopen(fid, unix.O_RDWR); err != nil {
		t.Fatal(err)
	}
	if n, err := c.WriteAt(fid, 0, data, 10); err != nil || n != len(data) {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	if got := o.Ctr.Reqs[p9wire.Twrite].Load(); got < uint64(len(data)/c.IOSize(0)) {
		t.Fatalf("%d Twrites for %d bytes of %d a message", got, len(data), c.IOSize(0))
	}
	back := make([]byte, len(data)+100)
	if n, err := c.ReadAt(fid, 0, back, 10); err != nil || n != len(data) || !bytes.Equal(back[:n], data) {
		t.Fatalf("ReadAt: %d bytes, %v; equal %v", n, err, bytes.Equal(back[:n], data))
	}
	ra, err := c.Getattr(fid)
	if err != nil || ra.Attr.Size != uint64(len(data)+10) {
		t.Fatalf("Getattr: size %d, %v", ra.Attr.Size, err)
	}
	if err := c.Clunk(fid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Getattr(fid); err != syscall.EBADF {
		t.Fatalf("Getattr of a clunked fid: %v, want EBADF", err)
	}
	// A dead connection fails every request at once.
	c.Close()
	<-c.Dead()
	if _, err := c.Getattr(root); err != ErrLost {
		t.Fatalf("Getattr on a closed connection: %v, want ErrLost", err)
	}
}
