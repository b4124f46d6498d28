package export

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// versionErrno sends a Tversion on r and returns the Rlerror's errno (0
// for an Rversion).
func versionErrno(t *testing.T, r *raw) uint32 {
	t.Helper()
	typ, body := r.rpc(t, frame(tVersion, 0xffff, uint32(64<<10), "9P2000.L"))
	e, err := lerror(typ, body)
	if err != nil {
		return 0
	}
	return e
}

// ended tells whether the server closed r within d (replies before the
// end are skipped).
func ended(r *raw, d time.Duration) bool {
	r.c.SetReadDeadline(time.Now().Add(d))
	for {
		if _, _, err := r.recv(); err != nil {
			return !errors.Is(err, os.ErrDeadlineExceeded)
		}
	}
}

// MaxConns: past it a newcomer takes the place of the session idle
// longest; with none idle it waits for one up to FirstTimeout (or Idle),
// then is refused (EUSERS). A journal read waiting for records is not being busy.
func TestMaxConns(t *testing.T) {
	const idle = 300 * time.Millisecond
	f := newFixture(t, Options{MaxConns: 1, Idle: idle, FirstTimeout: idle})
	busy := f.rawDial(t)
	busy.handshake(t, 64<<10, 0)
	// A request in flight (a lower layer that hangs until cancelled):
	// busy is not idle.
	if _, err := busy.c.Write(twalk(5, 0, 1, blockName)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if e := versionErrno(t, f.rawDial(t)); e != uint32(linux.EUSERS) {
		t.Fatalf("a newcomer while the one session is busy: errno %d, want EUSERS", e)
	}
	if el := time.Since(start); el < idle {
		t.Errorf("refused after %v, before waiting Idle (%v) for a session to go idle", el, idle)
	}
	// The walk ends (flushed): busy is idle from then on.
	busy.c.Write(frame(tFlush, 6, uint16(5)))
	for range 2 { // the walk's Rlerror, Rflush
		if _, _, err := busy.recv(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := f.tryDial("")
	if err != nil {
		t.Fatalf("a newcomer with the one session idle: %v", err)
	}
	defer s.cut(t)
	if !ended(busy, 10*time.Second) {
		t.Error("the idle session was not closed")
	}
	// A caching client, its journal read waiting: idle, reaped too.
	s.cut(t)
	c := f.jdial(t, testUUID, true)
	if _, err := c.c.Write(frame(tRead, 9, uint32(jfid), uint64(0), uint32(60000))); err != nil {
		t.Fatal(err)
	}
	n := f.rawDial(t)
	if e := versionErrno(t, n); e != 0 {
		t.Fatalf("a newcomer with a client waiting on its journal: errno %d", e)
	}
	if !ended(c.raw, 10*time.Second) {
		t.Error("the client waiting on its journal was not closed")
	}
	if got := f.s.reaped.Load(); got != 2 {
		t.Errorf("reaped %d, want 2", got)
	}
}

// peerConn is a connection from a remote address of one's choice.
type peerConn struct {
	net.Conn
	addr net.Addr
}

func (p peerConn) RemoteAddr() net.Addr { return p.addr }

// rawFrom is rawDial from another host's address.
func (f *fixture) rawFrom(t *testing.T, ip string) *raw {
	return f.rawOver(t, func(c net.Conn) net.Conn {
		return peerConn{c, &net.TCPAddr{IP: net.ParseIP(ip), Port: 564}}
	})
}

// MaxConnsPerPeer: a peer past its share is refused while others are
// served; its own idle sessions make room for it first.
func TestMaxConnsPerPeer(t *testing.T) {
	f := newFixture(t, Options{MaxConns: 4, MaxConnsPerPeer: 2, Idle: 200 * time.Millisecond, FirstTimeout: 200 * time.Millisecond})
	var mine []*raw
	for range 2 {
		r := f.rawFrom(t, "10.0.0.1")
		r.handshake(t, 64<<10, 0)
		r.c.Write(twalk(5, 0, 1, blockName)) // busy
		mine = append(mine, r)
	}
	if e := versionErrno(t, f.rawFrom(t, "10.0.0.1")); e != uint32(linux.EUSERS) {
		t.Fatalf("a third connection of one peer with two busy: errno %d, want EUSERS", e)
	}
	if e := versionErrno(t, f.rawFrom(t, "10.0.0.2")); e != 0 {
		t.Fatalf("another peer: errno %d", e)
	}
	mine[0].c.Write(frame(tFlush, 6, uint16(5)))
	for range 2 {
		mine[0].recv()
	}
	if e := versionErrno(t, f.rawFrom(t, "10.0.0.1")); e != 0 {
		t.Fatalf("the peer with an idle session: errno %d", e)
	}
	if !ended(mine[0], 10*time.Second) {
		t.Error("the peer's idle session was not closed for its newcomer")
	}
}

// A connection must send its first message within FirstTimeout; after
// it, it may be quiet.
func TestFirstMessageDeadline(t *testing.T) {
	f := newFixture(t, Options{FirstTimeout: 200 * time.Millisecond})
	silent := f.rawDial(t)
	start := time.Now()
	if !ended(silent, 10*time.Second) {
		t.Fatal("a connection that said nothing was not closed")
	}
	t.Logf("closed after %v", time.Since(start))
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	if ended(r, 600*time.Millisecond) {
		t.Fatal("a quiet session was closed")
	}
	r.must(t, "getattr", frame(tGetattr, 1, uint32(0), uint64(0x3fff)))
}

// 1,000 connections that say nothing leave a client able to attach at
// once: the oldest silent ones make room. Before, the first 64 held
// every slot (until they went) and the client was refused.
func TestSilentConnections(t *testing.T) {
	f := newFixture(t, Options{})
	var rs []*raw
	for range 1000 {
		rs = append(rs, f.rawDial(t))
	}
	// All served (slowly, under the race detector): pending, or closed
	// to make room.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ended := 0
		for _, r := range rs {
			select {
			case <-r.done:
				ended++
			default:
			}
		}
		if ended+f.s.pending.Len() == len(rs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ended, %d pending of %d", ended, f.s.pending.Len(), len(rs))
		}
	}
	start := time.Now()
	s, err := f.tryDial("")
	if err != nil {
		t.Fatalf("with 1,000 silent connections: %v", err)
	}
	defer s.cut(t)
	t.Logf("attached in %v with 1,000 silent connections", time.Since(start))
	if n := f.s.pending.Len(); n > 2*64 {
		t.Errorf("%d connections pending, more than the bound", n)
	}
}

// openTime opens path for reading over r as fid, and returns how long
// the open took.
func openTime(t *testing.T, r *raw, fid uint32, path string) time.Duration {
	t.Helper()
	r.must(t, "walk", twalk(1, 0, fid, path))
	start := time.Now()
	r.must(t, "open", frame(tLopen, 1, fid, uint32(syscall.O_RDONLY)))
	return time.Since(start)
}

// spriteFixture serves a file f under Sprite's rules, with a caching
// client that said hello.
func spriteFixture(t *testing.T, recall time.Duration) (*fixture, *jclient) {
	f := newFixture(t, Options{NoRootSquash: true, Sprite: true, RecallTimeout: recall})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("server's"), 0o644)
	a := f.jdial(t, testUUID, true)
	hello := journal.Append(nil, &journal.Record{Kind: journal.Clean})
	a.must(t, "hello", frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(hello)), hello))
	return f, a
}

// A client that does not answer a recall in time loses its caching of
// the file: it stalls another's open once, not at each of its opens for
// writing again, and what it writes back of what it held is refused,
// through a write-back open or a reclaim.
func TestRecallIgnored(t *testing.T) {
	const recall = 2 * time.Second
	f, a := spriteFixture(t, recall)
	openW := func(fid uint32, flags uint32) (uint8, []byte) {
		a.must(t, "walk", twalk(1, 0, fid, "f"))
		return a.rpc(t, frame(tLopen, 1, fid, flags))
	}
	if typ, _ := openW(1, uint32(syscall.O_RDWR)); typ == rLerror {
		t.Fatal("A's open for writing failed")
	}
	a.must(t, "clunk", frame(tClunk, 1, uint32(1)))
	b := f.other(t)
	took := openTime(t, b, 60, "f")
	t.Logf("B's first open: %v (recall timeout %v)", took, recall)
	if took < recall {
		t.Fatalf("B's open took %v: A was not recalled", took)
	}
	b.must(t, "clunk", frame(tClunk, 1, uint32(60)))
	for i := range 2 {
		// A opens for writing again, and would have the file dirty: B
		// does not wait for it again.
		typ, body := openW(uint32(2+i), uint32(syscall.O_RDWR))
		if typ == rLerror {
			t.Fatalf("A's open %d for writing failed", i+2)
		}
		if d := (p9wire.Dec{B: body}); d.Qid().Vers&journal.NoCache == 0 {
			t.Errorf("A's open %d after its failed recall lets it cache", i+2)
		}
		a.must(t, "write through", frame(tWrite, 1, uint32(2+i), uint64(0), uint32(1), []byte("A")))
		took := openTime(t, b, 60, "f")
		b.must(t, "clunk", frame(tClunk, 1, uint32(60)))
		if took >= recall {
			t.Errorf("B's open %d waited %v for A again", i+2, took)
		}
	}
	// What A held back it may still write back, no one else having
	// opened the file for writing: through a write-back open, and a
	// reclaim, which marks nothing B waits for.
	if typ, body := openW(9, uint32(syscall.O_WRONLY)|journal.WriteBack); typ == rLerror {
		e, _ := lerror(typ, body)
		t.Errorf("A's write-back open after its failed recall, no one else writing: errno %d", e)
	}
	q := a.walkTo(t, 10, "f")
	dirty := journal.Append(nil, &journal.Record{Kind: journal.Dirty, Qid: q})
	reclaim := func() uint32 {
		typ, body := a.rpc(t, frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(dirty)), dirty))
		if typ != rLerror {
			return 0
		}
		e, _ := lerror(typ, body)
		return e
	}
	if e := reclaim(); e != 0 {
		t.Errorf("A's reclaim after a failed recall, no one else writing: errno %d", e)
	}
	if took := openTime(t, b, 61, "f"); took >= recall {
		t.Errorf("B's open waited %v for A's reclaim", took)
	}
	b.must(t, "clunk", frame(tClunk, 1, uint32(61)))
	// Once B opened it for writing, what A held back is refused.
	b.must(t, "walk", twalk(1, 0, 62, "f"))
	b.must(t, "open", frame(tLopen, 1, uint32(62), uint32(syscall.O_WRONLY)))
	if typ, body := openW(11, uint32(syscall.O_WRONLY)|journal.WriteBack); typ != rLerror {
		t.Error("A's write-back open after B's open for writing was accepted")
	} else if e, _ := lerror(typ, body); e != uint32(syscall.ESTALE) {
		t.Errorf("A's write-back open after B's: errno %d, want ESTALE", e)
	}
	if e := reclaim(); e != uint32(syscall.ESTALE) {
		t.Errorf("A's reclaim after B's open for writing: errno %d, want ESTALE", e)
	}
	if n := f.s.sp.evictions.Load(); n != 1 {
		t.Errorf("evictions %d, want 1", n)
	}
}

// A handle its client had open when it failed a recall writes on, until
// another client opens the file for writing: then it writes no more.
func TestRecallIgnoredOpenHandle(t *testing.T) {
	f, a := spriteFixture(t, 500*time.Millisecond)
	a.must(t, "walk", twalk(1, 0, 1, "f"))
	a.must(t, "open", frame(tLopen, 1, uint32(1), uint32(syscall.O_RDWR)))
	b := f.other(t)
	openTime(t, b, 60, "f") // shared: A is asked to stop caching, and does not answer
	a.must(t, "write after a reader's open", frame(tWrite, 1, uint32(1), uint64(0), uint32(1), []byte("A")))
	b.must(t, "walk", twalk(1, 0, 61, "f"))
	b.must(t, "open", frame(tLopen, 1, uint32(61), uint32(syscall.O_WRONLY)))
	typ, body := a.rpc(t, frame(tWrite, 1, uint32(1), uint64(1), uint32(1), []byte("A")))
	if e, err := lerror(typ, body); err != nil || e != uint32(syscall.ESTALE) {
		t.Errorf("A's write through its handle after B's open for writing: errno %d (%v), want ESTALE", e, err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.dir, "f")); string(b) != "Aerver's" {
		t.Errorf("LOWER holds %q, want %q", b, "Aerver's")
	}
}

// A client that answers a recall slowly, writing the file back for
// longer than the recall timeout (much delayed data over a slow link),
// is waited for while it writes, not evicted.
func TestRecallSlowAnswer(t *testing.T) {
	const recall = 500 * time.Millisecond
	f, a := spriteFixture(t, recall)
	a.must(t, "walk", twalk(1, 0, 1, "f"))
	if typ, _ := a.rpc(t, frame(tLopen, 1, uint32(1), uint32(syscall.O_RDWR))); typ == rLerror {
		t.Fatal("A's open for writing failed")
	}
	a.must(t, "clunk", frame(tClunk, 1, uint32(1)))
	b := f.other(t)
	took := make(chan time.Duration, 1)
	go func() { took <- openTime(t, b, 60, "f") }()
	asked := func() bool {
		f.s.sp.mu.Lock()
		defer f.s.sp.mu.Unlock()
		for _, st := range f.s.sp.files {
			if len(st.asked) > 0 {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !asked(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("B's open recalled nothing")
		}
	}
	// A writes back, a byte at a time, for four recall timeouts.
	a.must(t, "walk", twalk(1, 0, 2, "f"))
	a.must(t, "write-back open", frame(tLopen, 1, uint32(2), uint32(syscall.O_WRONLY)|journal.WriteBack))
	start := time.Now()
	for i := 0; time.Since(start) < 4*recall; i++ {
		a.must(t, "write back", frame(tWrite, 1, uint32(2), uint64(i), uint32(1), []byte("A")))
		time.Sleep(recall / 5)
	}
	select {
	case d := <-took:
		t.Fatalf("B's open returned after %v, while A was still writing the file back", d)
	default:
	}
	if n := f.s.sp.evictions.Load(); n != 0 {
		t.Fatalf("A was evicted while writing back (%d evictions)", n)
	}
	<-took // A stops without a Clean: B's open goes on a recall timeout later
}
