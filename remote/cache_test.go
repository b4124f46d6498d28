package remote

import (
	"bytes"
	"testing"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/stack"
)

// testCache is a cache with a journal reader, as a client with a
// controller has them, and the events its records raise.
func testCache(t *testing.T) (*jreader, *cache, *[]layer.Event) {
	st := stack.New(stack.Options{CoherenceOff: true})
	var evs []layer.Event
	st.Events().Subscribe(func(ev layer.Event) { evs = append(evs, ev) })
	fs := &FS{st: st, live: map[uint64]liveTok{}}
	fs.cc = newCache(100, newMemBlocks(1<<20))
	fs.cc.live = fs.isLive
	fs.cc.on.Store(true)
	fs.jr = &jreader{fs: fs, uuid: newUUID()}
	return fs.jr, fs.cc, &evs
}

// fill caches a directory 1 with child 2 named "f", and 3 blocks of 2.
func fill(c *cache) {
	s := c.snap()
	a := layer.Attr{Mode: 0o40755}
	c.putAttr(s, 1, 1, &a)
	c.putLookup(s, 1, "f", 0, 2, 1, &layer.Attr{Mode: 0o100644, Size: 2*blockSize + 5})
	c.putLookup(s, 1, "gone", 0, 0, 0, nil)
	c.putListing(s, 1, 0, []layer.DirEntry{{Name: "f", Off: 1}})
	c.putData(s, 2, 1, 0, bytes.Repeat([]byte("x"), 2*blockSize+5), true)
}

func rec(seq uint64, path uint64, fs ...journal.Field) *journal.Record {
	return &journal.Record{Kind: journal.Change, Epoch: 7, Seq: seq, Qid: p9wire.Qid{Path: path}, Fields: fs}
}

func TestApplyRecords(t *testing.T) {
	j, c, evs := testCache(t)
	fill(c)
	buf := make([]byte, 3*blockSize)
	if k, ok := c.read(2, buf, 0); !ok || k != 2*blockSize+5 {
		t.Fatalf("read all: %d %v", k, ok)
	}
	// Data in the second block: that one and the last (short) go, the
	// first stays, and so do the directory's name and listing.
	j.apply(rec(1, 2, journal.Field{Type: journal.Data, Off: blockSize + 3, Len: 10}))
	if _, ok := c.read(2, buf[:10], 0); !ok {
		t.Error("block 0 dropped by a change in block 1")
	}
	if _, ok := c.read(2, buf[:10], blockSize); ok {
		t.Error("block 1 kept after a change in it")
	}
	if _, _, ok := c.attr(2); ok {
		t.Error("attributes kept after a data change")
	}
	if _, ok := c.listing(1, 0); !ok {
		t.Error("the directory's listing dropped by a file's data change")
	}
	// An entry: the name, the listing and the directory's attributes go;
	// the other name stays.
	j.apply(rec(2, 1, journal.Field{Type: journal.Entry, Op: journal.EntryRemoved, Name: "gone"}))
	if _, _, _, _, ok := c.lookup(1, "gone", 0); ok {
		t.Error("negative entry kept after the name changed")
	}
	if _, ok := c.listing(1, 0); ok {
		t.Error("listing kept after an entry changed")
	}
	if _, _, ok := c.attr(1); ok {
		t.Error("directory attributes kept after an entry changed")
	}
	// A record of an older sequence is applied already.
	c.putAttr(c.snap(), 1, 1, &layer.Attr{Mode: 0o40755})
	j.apply(rec(2, 1, journal.Field{Type: journal.Attrs}))
	if _, _, ok := c.attr(1); !ok {
		t.Error("a record read again dropped what was cached since")
	}
	// A field this reader does not know drops all of the QID.
	j.apply(rec(3, 2, journal.Field{Type: 99, Raw: []byte{1}}))
	if _, ok := c.read(2, buf[:10], 0); ok {
		t.Error("data kept after a record with an unknown field")
	}
	// Another epoch drops everything.
	j.apply(&journal.Record{Kind: journal.Change, Epoch: 8, Seq: 1, Qid: p9wire.Qid{Path: 5}, Fields: []journal.Field{{Type: journal.Attrs}}})
	if n, _ := c.size(); n != 0 {
		t.Errorf("%d QIDs cached after a new epoch", n)
	}
	if len(*evs) == 0 || (*evs)[len(*evs)-1].Kind != layer.Everything {
		t.Errorf("events %v: want Everything last", *evs)
	}
	// A Reset drops everything.
	fill(c)
	j.apply(&journal.Record{Kind: journal.Reset, Epoch: 8, Seq: 2})
	if n, _ := c.size(); n != 0 {
		t.Errorf("%d QIDs cached after a reset", n)
	}
}

// A fetch that began before a record and ends after it puts nothing.
func TestFetchRace(t *testing.T) {
	j, c, _ := testCache(t)
	s := c.snap()
	j.apply(rec(1, 2, journal.Field{Type: journal.Attrs}))
	c.putAttr(s, 2, 1, &layer.Attr{Size: 1})
	if _, _, ok := c.attr(2); ok {
		t.Fatal("attributes read before a change were kept after its record")
	}
	c.putAttr(s, 3, 1, &layer.Attr{Size: 1})
	if _, _, ok := c.attr(3); !ok {
		t.Fatal("a record about another QID refused a put")
	}
	// A drop of everything refuses every fetch begun before it.
	s = c.snap()
	c.dropAll()
	c.putAttr(s, 4, 1, &layer.Attr{})
	if _, _, ok := c.attr(4); ok {
		t.Fatal("a put begun before a drop of everything was kept")
	}
}

// Events for records name the live node's token, after the cache dropped.
func TestRecordEvents(t *testing.T) {
	j, c, evs := testCache(t)
	n := j.fs.newNode(layer.Token{Ino: 2, Gen: 9})
	fill(c)
	j.fs.st.Events().Subscribe(func(ev layer.Event) {
		if _, _, ok := c.attr(2); ok && ev.Token.Ino == 2 {
			t.Error("event raised before the cache dropped")
		}
	})
	j.apply(rec(1, 2, journal.Field{Type: journal.Data, Off: 4, Len: 8}))
	if len(*evs) != 1 || (*evs)[0] != (layer.Event{Kind: layer.Data, Token: layer.Token{Ino: 2, Gen: 9}, Off: 4, Len: 8}) {
		t.Fatalf("events %+v", *evs)
	}
	n.Forget()
}
