package export

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// helloFollows is the hello of a client that takes Follow.
func helloFollows() []byte {
	return journal.Append(nil, &journal.Record{Kind: journal.Clean, Qid: p9wire.Qid{Vers: journal.Follows}})
}

// heldRec is client's Held of q: size and mtime.
func heldRec(q p9wire.Qid, size uint64, mtime time.Time) []byte {
	return journal.Append(nil, &journal.Record{Kind: journal.Held, Qid: q, Fields: []journal.Field{journal.HeldField(size, mtime)}})
}

// statOf is the size and mtime a Tgetattr reply says.
func statOf(t *testing.T, r reply) (uint64, time.Time) {
	t.Helper()
	if r.typ != tGetattr+1 {
		t.Fatalf("getattr: reply type %d", r.typ)
	}
	d := p9wire.Dec{B: r.body}
	a := d.Getattr().Attr
	return a.Size, a.Mtime
}

// Attributes of delayed data (issue 23): client A opened f for writing
// and holds delayed writes of it. Another connection's first Tgetattr
// asks A (a Follow in A's journal) and answers with A's size and mtime
// (its Held); A's next Held, at a close, returns once the clients that
// follow f applied the Attrs record it makes, and stats show it.
func TestHeldAttrs(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true, Sprite: true, RecallTimeout: time.Minute})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("server's"), 0o644)
	a := f.jdial(t, testUUID, true)
	a.must(t, "hello", frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(helloFollows())), helloFollows()))
	a.must(t, "walk", twalk(1, 0, 1, "f"))
	body := a.must(t, "open", frame(tLopen, 1, uint32(1), uint32(syscall.O_RDWR)))
	q := (&p9wire.Dec{B: body}).Qid()
	q.Vers = 0

	// B, a plain client, stats f: the server asks A.
	b := f.other(t)
	b.must(t, "walk", twalk(1, 0, 2, "f"))
	stat := b.send(frame(tGetattr, 2, uint32(2), uint64(0x3fff)))
	recs := a.read(t, 0)
	if len(recs) != 1 || recs[0].Kind != journal.Follow || recs[0].Qid.Path != q.Path {
		t.Fatalf("A's journal after B's stat: %v, want one Follow of %d", shows(recs), q.Path)
	}
	mtime := time.Unix(time.Now().Unix()+3600, 5) // later than the server's: the later one shows
	held := heldRec(q, 12345, mtime)
	a.must(t, "held", frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(held)), held))
	if size, mt := statOf(t, <-stat); size != 12345 || !mt.Equal(mtime) {
		t.Fatalf("B's stat: size %d, mtime %v; want A's, 12345 and %v", size, mt, mtime)
	}

	// C, with a journal, follows f too; A's next Held (a close that
	// wrote) returns once C applied what it makes.
	c := f.jdial(t, "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", true)
	c.walkTo(t, 1, "f")
	mtime2 := mtime.Add(time.Hour)
	held = heldRec(q, 777, mtime2)
	told := a.send(frame(tWrite, 1, uint32(jfid), uint64(0), uint32(len(held)), held))
	crecs := c.read(t, 0)
	if s := shows(crecs); len(s) != 1 || s[0] != show(journal.Record{Kind: journal.Change, Qid: q, Fields: []journal.Field{{Type: journal.Attrs}}}) {
		t.Fatalf("C's journal after A's Held: %v, want a Change of f's attributes", s)
	}
	answeredOnly(t, told, tWrite+1, "A's Held", "C applied its record", func() {
		c.c.Write(frame(tRead, 9, uint32(jfid), seqAfter(crecs), uint32(60000)))
	})
	b.must(t, "walk", twalk(3, 0, 3, "f"))
	if size, mt := statOf(t, <-b.send(frame(tGetattr, 4, uint32(3), uint64(0x3fff)))); size != 777 || !mt.Equal(mtime2) {
		t.Fatalf("B's stat after A's second Held: size %d, mtime %v; want 777 and %v", size, mt, mtime2)
	}
	// A's own stat is the server's: A knows its own.
	if size, _ := statOf(t, <-a.send(frame(tGetattr, 5, uint32(1), uint64(0x3fff)))); size != 8 {
		t.Fatalf("A's own stat: size %d, want the server's 8", size)
	}
}
