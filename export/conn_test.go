package export

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/journal"
)

// The connection: its bounds, its end, Tflush and Tversion.

// MaxFids bounds the files a connection holds; clunking frees room.
func TestMaxFids(t *testing.T) {
	f := newFixture(t, Options{MaxFids: 20})
	os.WriteFile(filepath.Join(f.dir, "x"), nil, 0o644)
	s := f.dial(t, "")
	var held []p9.File
	for {
		_, nf, err := s.root.Walk([]string{"x"})
		if err != nil {
			if !errors.Is(err, linux.EMFILE) {
				t.Fatalf("walk past the limit: %v, want EMFILE", err)
			}
			break
		}
		held = append(held, nf)
		if len(held) > 20 {
			t.Fatal("walked past MaxFids")
		}
	}
	if len(held) < 15 {
		t.Fatalf("only %d walks before EMFILE", len(held))
	}
	held[0].Close()
	if _, nf, err := s.root.Walk([]string{"x"}); err != nil {
		t.Fatalf("walk after a clunk: %v", err)
	} else {
		nf.Close()
	}
}

// A connection cut in the middle leaves nothing behind: no node, handle,
// directory stream, host descriptor or lock.
func TestCleanupOnDisconnect(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	for i := range 10 {
		os.WriteFile(filepath.Join(f.dir, fmt.Sprint(i)), []byte("data"), 0o644)
	}
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	fds := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	before := fds()
	r := f.rawDial(t)
	r.openRW(t, "3")
	if st := r.lock(t, 1, p9.WriteLock, 0, 0, 0); st != p9.LockStatusOK {
		t.Fatalf("lock: %v", st)
	}
	r.must(t, "walk d", twalk(1, 0, 2, "d"))
	r.must(t, "open d", frame(tLopen, 1, uint32(2), uint32(0)))
	r.must(t, "readdir", frame(tReaddir, 1, uint32(2), uint64(0), uint32(1000)))
	for i := range uint32(100) {
		r.must(t, "walk", twalk(1, 0, 10+i, fmt.Sprint(i%10)))
		if i%3 == 0 {
			r.must(t, "open", frame(tLopen, 1, 10+i, uint32(0)))
		}
	}
	r.must(t, "walk", twalk(1, 0, 3))
	r.must(t, "create", frame(tLcreate, 1, uint32(3), "new", uint32(2), uint32(0o644), ^uint32(0)))
	if f.c.nodes.Load() == 0 || f.c.handles.Load() == 0 || f.c.dirs.Load() == 0 {
		t.Fatal("the test holds nothing")
	}
	r.c.Close()
	<-r.done
	f.c.check(t)
	if after := fds(); after > before {
		t.Errorf("%d descriptors before, %d after", before, after)
	}
	// The lock is gone, as another connection sees.
	o := f.rawDial(t)
	o.openRW(t, "3")
	if st := o.lock(t, 1, p9.WriteLock, 0, 0, 0); st != p9.LockStatusOK {
		t.Fatalf("lock after the holder was cut: %v", st)
	}
}

// Clunking everything releases everything while the connection lasts.
func TestClunkReleases(t *testing.T) {
	f := newFixture(t, Options{})
	os.WriteFile(filepath.Join(f.dir, "x"), nil, 0o644)
	s := f.dial(t, "")
	for range 10 {
		x := walk(t, s.root, "x")
		x.Open(p9.ReadOnly)
		y := walk(t, x)
		x.Close()
		y.Close()
	}
	f.c.check(t)
}

// A message larger than msize is skipped and answered EMSGSIZE; the
// connection goes on.
func TestOversizedMessage(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.rawDial(t)
	r.handshake(t, 8192, nobodyUid)
	big := frame(tWrite, 9, uint32(0), uint64(0), uint32(100000), make([]byte, 100000))
	go r.c.Write(big) // the pipe takes it as the server reads it
	r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, body, err := r.recv()
	if err != nil {
		t.Fatal(err)
	}
	if e, err := lerror(typ, body); err != nil || e != uint32(linux.EMSGSIZE) {
		t.Fatalf("oversized message: reply %d errno %d", typ, e)
	}
	r.must(t, "getattr after", frame(tGetattr, 1, uint32(0), uint64(0x3fff)))
}

// Serve over a unix socket; cancelling its context closes every
// connection and releases what they held.
func TestServe(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "x"), []byte("x"), 0o644)
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- f.s.Serve(ctx, l) }()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := p9.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	root, err := cl.Attach("") // no uid: nobody
	if err != nil {
		t.Fatal(err)
	}
	x := walk(t, root, "x")
	if _, _, err := x.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	if n := f.s.Requests(); n < 4 {
		t.Fatalf("Requests() = %d after version, attach, walk, open", n)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	f.c.check(t)
	if _, err := c.Read(make([]byte, 1)); err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("connection after Serve returned: %v", err)
	}
}

// hungWalk is a connection with a walk of tag 5 (to fid 1) hung in a
// layer until it is cancelled.
func hungWalk(t *testing.T) *raw {
	r := newFixture(t, Options{}).rawDial(t)
	r.handshake(t, 64<<10, nobodyUid)
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write(twalk(5, 0, 1, blockName)); err != nil {
		t.Fatal(err)
	}
	return r
}

// Tflush cancels a request that hangs in a layer, and answers after it.
func TestFlush(t *testing.T) {
	r := hungWalk(t)
	// Other requests are served meanwhile.
	r.must(t, "getattr while one hangs", frame(tGetattr, 6, uint32(0), uint64(0x3fff)))
	if _, err := r.c.Write(frame(tFlush, 7, uint16(5))); err != nil {
		t.Fatal(err)
	}
	var tags []uint16
	for len(tags) == 0 || tags[len(tags)-1] != 7 {
		var hdr [7]byte
		if _, err := io.ReadFull(r.c, hdr[:]); err != nil {
			t.Fatalf("after Tflush: %v (got tags %v)", err, tags)
		}
		io.CopyN(io.Discard, r.c, int64(binary.LittleEndian.Uint32(hdr[:]))-7)
		tags = append(tags, binary.LittleEndian.Uint16(hdr[5:]))
	}
	if len(tags) > 2 || len(tags) == 2 && tags[0] != 5 {
		t.Fatalf("replies by tag: %v, want the flushed one (or none) before Rflush", tags)
	}
	// Tag 5 is free again, and the fid was not made.
	if e, err := lerror(r.rpc(t, frame(tGetattr, 5, uint32(1), uint64(0x3fff)))); err != nil || e != uint32(linux.EBADF) {
		t.Fatalf("getattr of the flushed walk's fid: %d %v", e, err)
	}
}

// Tversion aborts the requests of the old session (version(5)): one that
// hangs in a layer until cancelled does not hold the new session up.
func TestVersionAborts(t *testing.T) {
	r := hungWalk(t)
	if _, err := r.c.Write(frame(tVersion, 0xffff, uint32(8192), "9P2000.L")); err != nil {
		t.Fatal(err)
	}
	for {
		var hdr [7]byte
		if _, err := io.ReadFull(r.c, hdr[:]); err != nil {
			t.Fatalf("no Rversion while a request hangs: %v", err)
		}
		io.CopyN(io.Discard, r.c, int64(binary.LittleEndian.Uint32(hdr[:]))-7)
		if hdr[4] == tVersion+1 {
			break
		}
	}
}

// A client slow to take a large reply does not stop the server reading
// its next requests: before, the reading loop took the reply writer's
// lock for msize before each frame, and waited for the write to end.
func TestReadingGoesOnBehindSlowReply(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	if err := os.WriteFile(filepath.Join(f.dir, "big"), make([]byte, 60<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.must(t, "walk", twalk(1, 0, 1, "big"))
	r.must(t, "open", frame(tLopen, 1, uint32(1), uint32(0)))
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write(frame(tRead, 2, uint32(1), uint64(0), uint32(60<<10))); err != nil {
		t.Fatal(err)
	}
	// Its reply's write now waits for us (a pipe has no buffer).
	time.Sleep(200 * time.Millisecond)
	for tag := uint16(3); tag <= 5; tag++ {
		if _, err := r.c.Write(frame(tGetattr, tag, uint32(0), uint64(0x3fff))); err != nil {
			t.Fatalf("request %d not read while a reply waits to be taken: %v", tag, err)
		}
	}
	for range 4 {
		if typ, body, err := r.recv(); err != nil || typ == rLerror {
			t.Fatalf("reply: type %d, %d bytes, %v", typ, len(body), err)
		}
	}
}

// Opens that wait for their own client's journal (what was queued for it
// applied first: Sprite's rules) give their slots back. With more of
// them at once than a connection serves, the journal read sent behind
// them is still read, and they are answered once the client applied
// what it read, not at the recall timeout (two minutes here: the test
// gives up after one).
func TestOpensWaitingOnOwnJournal(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true, Sprite: true, RecallTimeout: 2 * time.Minute})
	const n = maxInFlight + 8
	for i := range n {
		os.WriteFile(filepath.Join(f.dir, fmt.Sprint("f", i)), []byte("x"), 0o644)
	}
	a := f.jdial(t, testUUID, true)
	a.must(t, "hello", frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(helloFollows())), helloFollows()))
	for i := range n {
		a.walkTo(t, uint32(10+i), fmt.Sprint("f", i))
	}
	write(t, f.other(t), "f0", 0, "changed") // a record queued for a
	var m []byte
	for i := range n {
		m = append(m, frame(tLopen, uint16(100+i), uint32(10+i), uint32(os.O_RDONLY))...)
	}
	m = append(m, frame(tRead, 9, uint32(jfid), uint64(0), uint32(60000))...)
	a.c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := a.c.Write(m); err != nil {
		t.Fatal(err)
	}
	for opened := 0; opened < n; {
		typ, body, err := a.recv()
		if err != nil {
			t.Fatalf("%d of %d opens answered, then: %v", opened, n, err)
		}
		switch typ {
		case tRead + 1: // the records: applied, as the next read says
			k := binary.LittleEndian.Uint32(body)
			var last uint64
			for b := body[4 : 4+k]; len(b) > 0; {
				r, rest, err := journal.Next(b)
				if err != nil {
					t.Fatal(err)
				}
				last, b = r.Seq, rest
			}
			a.c.Write(frame(tRead, 8, uint32(jfid), last, uint32(60000)))
		case tLopen + 1:
			opened++
		default:
			t.Fatalf("reply type %d (%q)", typ, body)
		}
	}
}
