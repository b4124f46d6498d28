package export

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/journal"
)

// A Twalk, the Tlopen and Tread of the fid it makes and its Tclunk, sent
// together, are served in that order (journal.OrdersFids), however long
// the walk takes: without the order, the Tlopen found no fid (EBADF).
func TestPipelinedFid(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	if err := os.WriteFile(filepath.Join(f.dir, slowName), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	f.c.hang = make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(f.c.hang) }) }) // before the connection's end, which waits for the walk
	var batch []byte
	batch = append(batch, twalk(1, 0, 1, slowName)...)
	batch = append(batch, frame(tLopen, 2, uint32(1), uint32(0))...)
	batch = append(batch, frame(tRead, 3, uint32(1), uint64(0), uint32(100))...)
	batch = append(batch, frame(tClunk, 4, uint32(1))...)
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write(batch); err != nil {
		t.Fatal(err)
	}
	// Nothing may be answered while the walk waits.
	r.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if typ, body, err := r.recv(); err == nil {
		t.Fatalf("a reply (type %d, %q) before the walk ended", typ, body)
	}
	release.Do(func() { close(f.c.hang) })
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	got := map[uint8][]byte{}
	for range 4 {
		typ, body, err := r.recv()
		if err != nil {
			t.Fatal(err)
		}
		if typ == rLerror {
			t.Fatalf("a request of the batch failed: errno %d", binary.LittleEndian.Uint32(body))
		}
		got[typ] = body
	}
	if b := got[tRead+1]; len(b) < 4 || string(b[4:]) != "hello" {
		t.Fatalf("read %q, want hello", b)
	}
	// The journal tree's root says the server keeps the order.
	j := f.dial(t, journal.Aname)
	if q, _, _, err := j.root.GetAttr(p9.AttrMask{}); err != nil || q.Version&journal.OrdersFids == 0 {
		t.Fatalf("the journal root's QID version %#x (%v) lacks OrdersFids", q.Version, err)
	}
}
