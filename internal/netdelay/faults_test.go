package netdelay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Faults are checked by what must happen, polled against generous
// deadlines; what must not happen (a byte across a partition) is watched
// for a short while only, the positive checks carrying each test.

const (
	patience = 10 * time.Second       // for what must happen
	silence  = 300 * time.Millisecond // watched for what must not
)

// echoes is an echo server that counts the connections it accepts and
// reports how each ended.
type echoes struct {
	addr     string
	accepted atomic.Int32
	ended    chan ended
}

type ended struct {
	n   int64 // bytes echoed
	err error
}

func newEchoes(t *testing.T) *echoes {
	e := &echoes{ended: make(chan ended, 16)}
	e.addr = server(t, func(c net.Conn) {
		e.accepted.Add(1)
		n, err := io.Copy(c, c)
		e.ended <- ended{n, err}
	})
	return e
}

// echo sends msg through c and wants it back.
func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("echo %q: %v", msg, err)
	}
	c.SetReadDeadline(time.Now().Add(patience))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("echo %q: %v", msg, err)
	}
	if string(buf) != msg {
		t.Fatalf("echo %q: got %q", msg, buf)
	}
}

// wantReset reads c until it ends, which must be by a reset.
func wantReset(t *testing.T, name string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	n, err := io.Copy(io.Discard, c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("%s: read %d bytes, then %v; want a reset", name, n, err)
	}
}

// wantSilence wants nothing to arrive on any of cs for a while.
func wantSilence(t *testing.T, cs map[string]net.Conn) {
	t.Helper()
	until := time.Now().Add(silence)
	for name, c := range cs {
		c.SetReadDeadline(until)
		n, err := c.Read(make([]byte, 64))
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: read %d bytes, %v; want nothing", name, n, err)
		}
		c.SetReadDeadline(time.Time{})
	}
}

// waitLost waits for want connections to have lost bytes to a partition:
// the relay reads them in its own time.
func waitLost(t *testing.T, p *Proxy, want int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		n := 0
		for _, r := range p.relays() {
			if r.lost.Load() {
				n++
			}
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections lost bytes, want %d", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReset(t *testing.T) {
	srv := newEchoes(t)
	p := listen(t, srv.addr, 0, 0)
	c1, c2 := dial(t, p.Addr()), dial(t, p.Addr())
	echo(t, c1, "one")
	echo(t, c2, "two")
	p.Reset()
	wantReset(t, "client 1", c1)
	wantReset(t, "client 2", c2)
	for range 2 {
		select {
		case e := <-srv.ended:
			if !errors.Is(e.err, syscall.ECONNRESET) {
				t.Errorf("server: connection ended with %v; want a reset", e.err)
			}
		case <-time.After(patience):
			t.Fatal("server: connection still open after Reset")
		}
	}
	echo(t, dial(t, p.Addr()), "after")
	if s := p.State(); s != "normal" {
		t.Errorf("state %q after Reset", s)
	}
}

func TestPartition(t *testing.T) {
	srv := newEchoes(t)
	p := listen(t, srv.addr, 0, 0)
	busy, idle := dial(t, p.Addr()), dial(t, p.Addr())
	echo(t, busy, "a")
	echo(t, idle, "b")

	p.Partition()
	if s := p.State(); s != "partitioned" {
		t.Errorf("state %q after Partition", s)
	}
	busy.Write([]byte("lost"))
	late := dial(t, p.Addr()) // accepted: a hang, not a refusal
	late.Write([]byte("lost too"))
	quiet := dial(t, p.Addr()) // accepted, sends nothing
	shut := dial(t, p.Addr())  // accepted, sends only its FIN
	shut.(*net.TCPConn).CloseWrite()
	waitLost(t, p, 3)
	wantSilence(t, map[string]net.Conn{"busy": busy, "late": late, "shut": shut})
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("server accepted %d connections, want 2: dialed across the partition", n)
	}

	p.Heal()
	wantReset(t, "busy", busy)
	wantReset(t, "late", late)
	wantReset(t, "shut", shut)
	select {
	case e := <-srv.ended:
		if e.n != 1 || !errors.Is(e.err, syscall.ECONNRESET) {
			t.Errorf("server: busy's connection echoed %d bytes, then %v; want 1 and a reset", e.n, e.err)
		}
	case <-time.After(patience):
		t.Fatal("server: busy's connection still open after Heal")
	}
	echo(t, idle, "idle goes on")
	echo(t, quiet, "quiet goes on")
	echo(t, dial(t, p.Addr()), "new")
}

// recorder collects what is written to it.
type recorder struct {
	mu sync.Mutex
	b  []byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b = append(r.b, p...)
	return len(p), nil
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.b)
}

func pattern(n, mul int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * mul / 251)
	}
	return b
}

func TestStall(t *testing.T) {
	down, up := pattern(256<<10, 3), pattern(256<<10, 7)
	release := make(chan struct{})
	var got recorder
	gotAll := make(chan struct{})
	addr := server(t, func(c net.Conn) {
		select {
		case <-release:
		case <-t.Context().Done():
			return
		}
		c.Write(down)
		io.Copy(&got, c)
		close(gotAll)
	})
	p := listen(t, addr, 0, 0)
	c := dial(t, p.Addr())

	p.Stall()
	if s := p.State(); s != "stalled" {
		t.Errorf("state %q after Stall", s)
	}
	close(release)
	sent := make(chan error, 1)
	go func() {
		// Many writes, so that many chunks wait in the queue.
		for b := up; len(b) > 0; b = b[4096:] {
			if _, err := c.Write(b[:4096]); err != nil {
				sent <- err
				return
			}
		}
		sent <- c.(*net.TCPConn).CloseWrite()
	}()
	wantSilence(t, map[string]net.Conn{"client": c})
	if n := len(got.bytes()); n > 0 {
		t.Errorf("server got %d bytes across a stall", n)
	}

	p.Heal()
	c.SetReadDeadline(time.Now().Add(patience))
	buf := make([]byte, len(down))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("client: %v", err)
	}
	if !bytes.Equal(buf, down) {
		t.Error("client: bytes held by the stall came out changed")
	}
	if err := <-sent; err != nil {
		t.Fatalf("client write: %v", err)
	}
	select {
	case <-gotAll: // the EOF, held too, crossed last
	case <-time.After(patience):
		t.Fatalf("server: no EOF after Heal; %d bytes", len(got.bytes()))
	}
	if !bytes.Equal(got.bytes(), up) {
		t.Errorf("server: got %d bytes, not the %d sent in order", len(got.bytes()), len(up))
	}
}

// TestFaultsRaceClose fires faults at relays while clients come and go
// and the proxy closes: nothing may panic, hang or leak.
func TestFaultsRaceClose(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		echo, stopEcho := echoServerManual(t)
		defer stopEcho()
		for i := range 8 {
			p, err := Listen("127.0.0.1:0", echo, time.Duration(i%2)*4*time.Millisecond, int64(i%3)<<20)
			if err != nil {
				t.Fatal(err)
			}
			var clients sync.WaitGroup
			for range 4 {
				clients.Add(1)
				go func() {
					defer clients.Done()
					client(t, p.Addr())
				}()
			}
			faults := []func(){p.Partition, p.Stall, p.Reset, p.Heal, p.Partition, p.Heal, p.Stall}
			halfway := make(chan struct{})
			var cmds sync.WaitGroup
			cmds.Add(1)
			go func() {
				defer cmds.Done()
				for k := range 300 {
					faults[(k+i)%len(faults)]()
					if k == 150 {
						close(halfway)
					}
					if k%10 == 0 {
						time.Sleep(time.Millisecond) // let connections move
					}
				}
			}()
			<-halfway
			if err := p.Close(); err != nil {
				t.Error(err)
			}
			cmds.Wait()
			clients.Wait()
			p.Reset() // after Close: nothing to do, nothing to break
			p.Heal()
		}
	}()
	settled(t, before, 5*time.Second)
}

// client echoes a few messages over a few connections to addr until the
// proxy stops answering, which Close must make it do promptly.
func client(t *testing.T, addr string) {
	msg := make([]byte, 10000)
	for range 5 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return // closed
		}
		c.SetDeadline(time.Now().Add(patience))
		_, err = c.Write(msg)
		if err == nil {
			_, err = io.ReadFull(c, msg)
		}
		c.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("client: %v: the proxy kept a connection past Close", err)
			return
		}
	}
}
