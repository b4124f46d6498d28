package export

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/p9wire"
)

// FuzzJournalWrite: a client writes any records to its journal while
// another client holds file "w" open for writing with delayed writes, and
// file "v" is open nowhere. Its Dirty, Clean and goodbye records never
// give it a mark on a file it never held (a forged Dirty would make every
// open of the file wait for it), never clear the other client's mark, and
// never panic. The input is one record of kind with seq, of QID path (0:
// v's, 1: w's), followed by any bytes.
func FuzzJournalWrite(f *testing.F) {
	for _, k := range []journal.Kind{journal.Dirty, journal.Clean, journal.Dropped, journal.Change, 0, 200} {
		for _, seq := range []uint64{0, 1, journal.Goodbye} {
			f.Add(uint8(k), seq, uint64(0), []byte(nil))
			f.Add(uint8(k), seq, uint64(1), []byte(nil))
		}
	}
	dirty := journal.Append(nil, &journal.Record{Kind: journal.Dirty, Qid: p9wire.Qid{Path: 1}})
	f.Add(uint8(journal.Clean), uint64(0), uint64(0), dirty)
	f.Add(uint8(journal.Dirty), uint64(0), uint64(7), dirty[:len(dirty)-3])
	fx := newFixture(f, Options{Sprite: true, NoRootSquash: true})
	owner := fx.jdial(f, "00000000-0000-4000-8000-000000000001", true)
	owner.must(f, "hello", frame(tWrite, 4, uint32(jfid), uint64(0), uint32(len(hello())), hello()))
	owner.must(f, "walk", twalk(5, 0, 1))
	owner.must(f, "create", frame(tLcreate, 6, uint32(1), "w", uint32(syscall.O_RDWR), uint32(0o600), ^uint32(0)))
	ino := func(name string) uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(fx.dir, name), &st); err != nil {
			f.Fatal(err)
		}
		return st.Ino
	}
	if err := os.WriteFile(filepath.Join(fx.dir, "v"), []byte("v"), 0o600); err != nil {
		f.Fatal(err)
	}
	victim, held := ino("v"), ino("w")
	ownerJ := fx.s.ctl.find("00000000-0000-4000-8000-000000000001")
	if !fx.s.sp.marked(ownerJ, held) {
		f.Fatal("the owner's open for writing left no dirty mark")
	}
	n := 0
	f.Fuzz(func(t *testing.T, kind uint8, seq, path uint64, tail []byte) {
		switch path {
		case 0:
			path = victim
		case 1:
			path = held
		}
		n++
		uuid := fmt.Sprintf("00000000-0000-4000-9000-%012d", n)
		c := fx.jdial(t, uuid, true)
		data := journal.Append(nil, &journal.Record{Kind: journal.Kind(kind), Seq: seq, Qid: p9wire.Qid{Path: path}})
		data = append(data, tail...)
		c.rpc(t, frame(tWrite, 4, uint32(jfid), uint64(0), uint32(len(data)), data))
		if j := fx.s.ctl.find(uuid); fx.s.sp.marked(j, victim) || fx.s.sp.marked(j, held) {
			t.Fatalf("a client that never opened the file got a dirty mark of it")
		}
		if !fx.s.sp.marked(ownerJ, held) {
			t.Fatalf("another client's records cleared the owner's dirty mark")
		}
		if n := fx.s.panics.Load(); n != 0 {
			t.Fatalf("%d requests panicked", n)
		}
	})
}

func hello() []byte { return journal.Append(nil, &journal.Record{Kind: journal.Clean}) }

// marked tells whether j has a dirty mark of path in some root.
func (sp *sprite) marked(j *jrnl, path uint64) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, st := range sp.filesOf(path) {
		if _, ok := st.dirty[j]; ok {
			return true
		}
	}
	return false
}

// TestRightsSyncGap: a stream of opens for writing, each writing its
// grant, has the flusher sync the rights file at most once a syncGap, not
// once an open (an fsync each made cache.sh's cp -a at 0 ms a fifth
// slower). Whatever the machine's speed, no more syncs can start than
// one and one a gap.
func TestRightsSyncGap(t *testing.T) {
	r := openRights(filepath.Join(t.TempDir(), "rights"), slog.New(slog.DiscardHandler))
	defer r.close()
	start := time.Now()
	for i := range 40 {
		r.grant("00000000-0000-4000-8000-000000000001", "uid:0", uint64(i+1))
		r.Recorded()
		time.Sleep(2 * time.Millisecond)
	}
	n := r.syncs.Load()
	elapsed := time.Since(start)
	if most := 1 + int64(elapsed/syncGap); n > most {
		t.Fatalf("40 grants in %v: %d syncs of the rights file, want at most %d (one a %v)", elapsed.Round(time.Millisecond), n, most, syncGap)
	}
	for deadline := time.Now().Add(10 * time.Second); r.syncs.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no sync of the rights file in 10 s")
		}
	}
}
