package export

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/p9wire"
)

// lockers are two connections with the file l open on fid 1.
func lockers(t *testing.T) (a, b *raw) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "l"), make([]byte, 100), 0o666)
	a, b = f.rawDial(t), f.rawDial(t)
	a.openRW(t, "l")
	b.openRW(t, "l")
	return a, b
}

// Locks (raw: the library's client sends Tlock without its fid): two
// connections conflict; a blocking request is answered Blocked, not waited
// for; unlock lets the other in; a connection that goes releases its locks.
func TestLocks(t *testing.T) {
	a, b := lockers(t)
	if st := a.lock(t, 1, p9.WriteLock, 0, 0, 10); st != p9.LockStatusOK {
		t.Fatalf("first lock: %v", st)
	}
	// Same client name and pid, other connection: another owner.
	if st := b.lock(t, 1, p9.WriteLock, 0, 5, 10); st != p9.LockStatusBlocked {
		t.Fatalf("conflicting lock: %v, want Blocked", st)
	}
	start := time.Now()
	if st := b.lock(t, 1, p9.ReadLock, p9.LockFlagsBlock, 0, 0); st != p9.LockStatusBlocked {
		t.Fatalf("blocking conflicting lock: %v, want Blocked", st)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("a blocking lock request waited")
	}
	if st := b.lock(t, 1, p9.WriteLock, 0, 10, 10); st != p9.LockStatusOK {
		t.Fatalf("lock of a free range: %v", st)
	}
	if st := a.lock(t, 1, p9.Unlock, 0, 0, 10); st != p9.LockStatusOK {
		t.Fatalf("unlock: %v", st)
	}
	if st := b.lock(t, 1, p9.WriteLock, 0, 0, 10); st != p9.LockStatusOK {
		t.Fatalf("lock after unlock: %v", st)
	}
	// b goes without unlocking: a gets the whole file.
	b.c.Close()
	<-b.done
	if st := a.lock(t, 1, p9.WriteLock, 0, 0, 0); st != p9.LockStatusOK {
		t.Fatalf("lock after the holder's connection ended: %v", st)
	}
	// Locking an unopened fid is EBADF.
	a.must(t, "walk", twalk(1, 0, 2, "l"))
	if e, err := lerror(a.rpc(t, tlock(1, 2, p9.WriteLock, 0, 0, 0))); err != nil || e != uint32(linux.EBADF) {
		t.Fatalf("lock of an unopened fid: %d %v", e, err)
	}
}

// Tgetlock tells the lock that conflicts, or none.
func TestGetlock(t *testing.T) {
	a, b := lockers(t)
	getlock := func(r *raw) (typ uint8, start, length uint64) {
		body := r.must(t, "getlock", frame(tGetlock, 1, uint32(1), uint8(p9wire.LockWrite), uint64(0), uint64(0), uint32(7), "b"))
		d := p9wire.Dec{B: body}
		return d.U8(), d.U64(), d.U64()
	}
	if typ, _, _ := getlock(b); typ != p9wire.LockUnlock {
		t.Fatalf("getlock of a free file: type %d", typ)
	}
	if st := a.lock(t, 1, p9.ReadLock, 0, 10, 5); st != p9.LockStatusOK {
		t.Fatalf("lock: %v", st)
	}
	if typ, start, length := getlock(b); typ != p9wire.LockRead || start != 10 || length != 5 {
		t.Fatalf("getlock: type %d start %d length %d, want a read lock at 10 for 5", typ, start, length)
	}
	// One's own lock does not conflict.
	body := a.must(t, "getlock", frame(tGetlock, 1, uint32(1), uint8(p9wire.LockWrite), uint64(0), uint64(0), uint32(42), "client"))
	if body[0] != p9wire.LockUnlock {
		t.Fatalf("getlock of one's own lock: type %d", body[0])
	}
}
