package export

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Tversion answers at most the msize asked (a client reads no larger
// reply), and refuses one too small to serve.
func TestVersionMsize(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.rawDial(t)
	body := r.must(t, "version", frame(tVersion, 0xffff, uint32(1000), "9P2000.L"))
	if msize := binary.LittleEndian.Uint32(body); msize != 1000 {
		t.Fatalf("Tversion of msize 1000 answered %d", msize)
	}
	body = r.must(t, "version", frame(tVersion, 0xffff, uint32(1<<30), "9P2000.L"))
	if msize := binary.LittleEndian.Uint32(body); msize != maxMsize {
		t.Fatalf("Tversion of msize 1<<30 answered %d, want %d", msize, maxMsize)
	}
	if e, err := lerror(r.rpc(t, frame(tVersion, 0xffff, uint32(100), "9P2000.L"))); err != nil || e != uint32(linux.EINVAL) {
		t.Fatalf("Tversion of msize 100: errno %d %v, want EINVAL", e, err)
	}
	// The session goes on at the msize of the last Tversion answered.
	r.must(t, "attach", frame(tAttach, 1, uint32(0), ^uint32(0), "", "", uint32(nobodyUid)))
	r.must(t, "getattr", frame(tGetattr, 1, uint32(0), uint64(0x3fff)))
}

// Reads and writes whose end would pass the largest offset are EINVAL,
// as pread(2) and pwrite(2) have it; the layers never see them.
func TestOffsetOverflow(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.must(t, "clone", twalk(1, 0, 1))
	r.must(t, "create", frame(tLcreate, 1, uint32(1), "o", uint32(2), uint32(0o644), ^uint32(0)))
	for _, m := range [][]byte{
		frame(tWrite, 1, uint32(1), uint64(math.MaxInt64-1), uint32(4), []byte("data")),
		frame(tWrite, 1, uint32(1), uint64(math.MaxUint64), uint32(4), []byte("data")),
		frame(tRead, 1, uint32(1), uint64(math.MaxInt64-1), uint32(10)),
		frame(tRead, 1, uint32(1), uint64(1<<63), uint32(10)),
	} {
		if e, err := lerror(r.rpc(t, m)); err != nil || e != uint32(linux.EINVAL) {
			t.Errorf("message type %d at an overflowing offset: errno %d %v, want EINVAL", m[4], e, err)
		}
	}
	if n := f.c.overflow.Load(); n != 0 {
		t.Errorf("%d overflowing reads or writes reached the layer", n)
	}
	// The largest offsets that do not overflow still go through.
	r.must(t, "read at the end", frame(tRead, 1, uint32(1), uint64(math.MaxInt64-10), uint32(10)))
}

const (
	tSymlink  = 16
	tMknod    = 18
	tRename   = 20
	tRemove   = 122
	tReadlink = 22
	tFsync    = 50
	tLink     = 70
	tRenameat = 74
)

// Names that cannot be one directory entry are EINVAL for what makes,
// moves or removes, and ENOENT for walks (as Linux): no layer sees them.
func TestBadNames(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "x"), nil, 0o644)
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	os.WriteFile(filepath.Join(f.dir, "d", "y"), nil, 0o644)
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.must(t, "walk x", twalk(1, 0, 2, "x"))
	const nofid = ^uint32(0)
	for _, name := range []string{"", ".", "..", "d/y", "a\x00b", "/"} {
		r.must(t, "clone", twalk(1, 0, 1))
		for _, m := range []struct {
			what string
			m    []byte
		}{
			{"mkdir", frame(tMkdir, 1, uint32(0), name, uint32(0o755), nofid)},
			{"lcreate", frame(tLcreate, 1, uint32(1), name, uint32(2), uint32(0o644), nofid)},
			{"symlink", frame(tSymlink, 1, uint32(0), name, "x", nofid)},
			{"mknod", frame(tMknod, 1, uint32(0), name, uint32(syscall.S_IFIFO|0o644), uint32(0), uint32(0), nofid)},
			{"link", frame(tLink, 1, uint32(0), uint32(2), name)},
			{"renameat to", frame(tRenameat, 1, uint32(0), "x", uint32(0), name)},
			{"renameat from", frame(tRenameat, 1, uint32(0), name, uint32(0), "z")},
			{"rename", frame(tRename, 1, uint32(2), uint32(0), name)},
			{"unlinkat", frame(tUnlinkat, 1, uint32(0), name, uint32(0))},
			{"rmdir", frame(tUnlinkat, 1, uint32(0), name, uint32(unix.AT_REMOVEDIR))},
		} {
			if e, err := lerror(r.rpc(t, m.m)); err != nil || e != uint32(linux.EINVAL) {
				t.Errorf("%s %q: errno %d %v, want EINVAL", m.what, name, e, err)
			}
		}
		r.must(t, "clunk", frame(tClunk, 1, uint32(1)))
		if name == "." || name == ".." {
			continue // walks serve these
		}
		if e, err := lerror(r.rpc(t, twalk(1, 0, 3, name))); err != nil || e != uint32(linux.ENOENT) {
			t.Errorf("walk %q: errno %d %v, want ENOENT", name, e, err)
		}
	}
	ents, _ := os.ReadDir(f.dir)
	if len(ents) != 2 {
		t.Errorf("the directory holds %d entries, want x and d", len(ents))
	}
	if _, err := os.Stat(filepath.Join(f.dir, "d", "y")); err != nil {
		t.Error(err)
	}
}

// The uid → groups cache asks the user database again after usersTTL,
// and holds at most maxUsers uids.
func TestGroupsCache(t *testing.T) {
	f := newFixture(t, Options{})
	s := f.s
	const uid = 4000000001 // in no user database
	s.users[uid] = groups{gid: 4242, supp: []uint32{}, at: time.Now().Add(-2 * usersTTL)}
	if g := s.groupsOf(uid); g.gid != uid {
		t.Errorf("an expired entry served: gid %d, want %d", g.gid, uid)
	}
	s.users[uid] = groups{gid: 4242, supp: []uint32{}, at: time.Now()}
	if g := s.groupsOf(uid); g.gid != 4242 {
		t.Errorf("a fresh entry not served: gid %d", g.gid)
	}
	for i := range uint32(maxUsers + 100) {
		s.groupsOf(3000000000 + i)
	}
	if n := len(s.users); n > maxUsers {
		t.Errorf("%d uids remembered, at most %d wanted", n, maxUsers)
	}
	if _, ok := s.users[3000000000+maxUsers+99]; !ok {
		t.Error("the last uid looked up is not remembered")
	}
}

// Root squash maps group 0 too: a claimed uid's primary and supplementary
// groups, and the group a request asks for what it makes.
func TestRootSquashGroups(t *testing.T) {
	f := newFixture(t, Options{})
	now := time.Now()
	f.s.users[1234] = groups{gid: 0, supp: []uint32{0, 7}, at: now}
	f.s.users[1235] = groups{gid: 1235, supp: []uint32{nobodyUid}, at: now}
	if c := f.s.caller(1234); c.Gid != nobodyUid || !slices.Equal(c.Supp, []uint32{nobodyUid, 7}) {
		t.Errorf("caller of a uid in group 0: gid %d supp %v", c.Gid, c.Supp)
	}
	if g := f.s.users[1234]; g.gid != 0 || g.supp[0] != 0 {
		t.Error("the cache was changed")
	}
	ns := New(f.st, nil, Options{NoRootSquash: true})
	ns.users[1234] = groups{gid: 0, supp: []uint32{0}, at: now}
	if w := ns.caller(1234); w.Gid != 0 || w.Supp[0] != 0 {
		t.Errorf("NoRootSquash: gid %d supp %v", w.Gid, w.Supp)
	}
	if os.Geteuid() != 0 {
		t.Skip("acting as other users needs root")
	}
	os.Chmod(f.dir, 0o777)
	var st unix.Stat_t
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 1234)
	r.must(t, "mkdir", frame(tMkdir, 1, uint32(0), "a", uint32(0o755), ^uint32(0)))
	if err := unix.Stat(filepath.Join(f.dir, "a"), &st); err != nil || st.Uid != 1234 || st.Gid != nobodyUid {
		t.Errorf("made by a uid of group 0: owner %d:%d %v, want 1234:%d", st.Uid, st.Gid, err, nobodyUid)
	}
	r = f.rawDial(t)
	r.handshake(t, 64<<10, 1235)
	r.must(t, "mkdir", frame(tMkdir, 1, uint32(0), "b", uint32(0o755), uint32(0)))
	if err := unix.Stat(filepath.Join(f.dir, "b"), &st); err != nil || st.Gid != nobodyUid {
		t.Errorf("made for group 0: group %d %v, want %d", st.Gid, err, nobodyUid)
	}
}

// A client that stops reading replies is cut after writeTimeout, and its
// connection releases everything.
func TestClientStopsReading(t *testing.T) {
	old := writeTimeout
	writeTimeout = 200 * time.Millisecond
	t.Cleanup(func() { writeTimeout = old })
	f := newFixture(t, Options{})
	r := f.rawDial(t)
	r.handshake(t, 64<<10, nobodyUid)
	r.must(t, "walk", twalk(1, 0, 1))
	r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write(frame(tGetattr, 1, uint32(0), uint64(0x3fff))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection lasts while its client reads nothing")
	}
	f.c.check(t)
}

// Tflush waits for a slot like any request: a flood of them does not
// make a goroutine each.
func TestFlushesInFlight(t *testing.T) {
	f := newFixture(t, Options{})
	f.c.hang = make(chan struct{})
	r := f.rawDial(t)
	r.handshake(t, 64<<10, nobodyUid)
	r.c.SetDeadline(time.Time{})
	go io.Copy(io.Discard, r.c)
	before := f.s.Requests()
	// The flushes go once the walk hangs: one that came before would
	// end it before it reached the layer, and the rest would not wait.
	if _, err := r.c.Write(twalk(1, 0, 1, hangName)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); f.c.hanging.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the walk never reached the layer")
		}
	}
	go func() {
		for i := range 500 {
			if _, err := r.c.Write(frame(tFlush, uint16(10+i), uint16(1))); err != nil {
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	n := f.s.Requests() - before
	close(f.c.hang)
	if n > maxInFlight+2 {
		t.Errorf("%d requests read while %d may be in flight", n, maxInFlight)
	}
}

// A root reached from the default root is a mount: Trename and Tremove of
// it are EBUSY, and the entry of its name it shadows stays.
func TestRenameRemoveOfRoot(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.Mkdir(filepath.Join(f.dir, "a"), 0o755) // shadowed by the root a
	os.WriteFile(filepath.Join(f.dir, "a", "hidden"), nil, 0o644)
	os.MkdirAll(filepath.Join(f.dir, "b", "c"), 0o755) // shadowed by the synthetic b
	roots := map[string]layer.Node{"": f.root}
	for _, name := range []string{"a", "b/c"} {
		n, err := hostfs.New(f.st, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Forget)
		roots[name] = n
	}
	f.s = New(f.st, roots, Options{NoRootSquash: true})
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	for _, path := range [][]string{{"a"}, {"b"}, {"b", "c"}} {
		r.must(t, "walk", twalk(1, 0, 1, path...))
		if e, err := lerror(r.rpc(t, frame(tRename, 1, uint32(1), uint32(0), "moved"))); err != nil || e != uint32(linux.EBUSY) {
			t.Errorf("rename of %v: errno %d %v, want EBUSY", path, e, err)
		}
		if e, err := lerror(r.rpc(t, frame(tRemove, 1, uint32(1)))); err != nil || e != uint32(linux.EBUSY) {
			t.Errorf("remove of %v: errno %d %v, want EBUSY", path, e, err)
		}
	}
	for _, p := range []string{"a/hidden", "b/c"} {
		if _, err := os.Stat(filepath.Join(f.dir, p)); err != nil {
			t.Errorf("the shadowed %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.dir, "moved")); err == nil {
		t.Error("a shadowed entry was renamed")
	}
}

// Tlink, Trenameat and Trename use the other fid they name while
// requests change it (Tlcreate) or clunk it: they wait for those, and the
// node they use is not Forgotten under them (the race detector and the
// counting layer tell).
func TestPeerFidInUse(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "x"), nil, 0o644)
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.c.SetDeadline(time.Now().Add(60 * time.Second))
	r.must(t, "walk x", twalk(1, 0, 3, "x"))
	for i := range 200 {
		r.must(t, "clone", twalk(1, 0, 2))
		r.must(t, "walk d", twalk(1, 0, 4, "d"))
		ms := [][]byte{
			frame(tLcreate, 1, uint32(2), fmt.Sprintf("c%d", i), uint32(2), uint32(0o644), ^uint32(0)),
			frame(tRenameat, 2, uint32(0), "x", uint32(2), "x"),
			frame(tLink, 3, uint32(0), uint32(2), fmt.Sprintf("l%d", i)),
			frame(tRename, 4, uint32(3), uint32(4), "x"),
			frame(tClunk, 5, uint32(4)),
			frame(tRename, 6, uint32(3), uint32(0), "x"),
			frame(tClunk, 7, uint32(2)),
		}
		go func() {
			for _, m := range ms {
				r.c.Write(m)
			}
		}()
		for range ms {
			if _, _, err := r.recv(); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.c.Close()
	<-r.done
	f.c.check(t)
}

// Trename acts only if f's name still is its file, and f's path is then
// its new directory's: ".." walks up from there.
func TestRenamePath(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.MkdirAll(filepath.Join(f.dir, "a", "b"), 0o755)
	os.Mkdir(filepath.Join(f.dir, "c"), 0o755)
	os.WriteFile(filepath.Join(f.dir, "a", "b", "x"), []byte("x"), 0o644)
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	qids := func(body []byte) []p9wire.Qid {
		d := p9wire.Dec{B: body}
		q := make([]p9wire.Qid, d.U16())
		for i := range q {
			q[i] = d.Qid()
		}
		return q
	}
	root := qids(r.must(t, "walk", twalk(1, 0, 9, "c", "..")))[1]
	r.must(t, "walk x", twalk(1, 0, 1, "a", "b", "x"))
	r.must(t, "walk c", twalk(1, 0, 2, "c"))
	r.must(t, "rename", frame(tRename, 1, uint32(1), uint32(2), "y"))
	if _, err := os.Stat(filepath.Join(f.dir, "c", "y")); err != nil {
		t.Fatal(err)
	}
	q := qids(r.must(t, "walk ../..", twalk(1, 1, 3, "..", "..")))
	if len(q) != 2 || q[1] != root {
		t.Fatalf("../.. of c/y: %v, want the root %v", q, root)
	}
	// Someone else moves y away and makes another: the rename of the fid
	// is ENOENT and touches neither.
	os.Rename(filepath.Join(f.dir, "c", "y"), filepath.Join(f.dir, "moved"))
	os.WriteFile(filepath.Join(f.dir, "c", "y"), []byte("other"), 0o644)
	if e, err := lerror(r.rpc(t, frame(tRename, 1, uint32(1), uint32(0), "z"))); err != nil || e != uint32(linux.ENOENT) {
		t.Fatalf("rename of a fid whose name is another file's: errno %d %v, want ENOENT", e, err)
	}
	if b, err := os.ReadFile(filepath.Join(f.dir, "c", "y")); err != nil || string(b) != "other" {
		t.Fatalf("the other file: %q %v", b, err)
	}
}

// A request too short to name its fid is refused, never served on fid 0
// (the root, attached first); and an xattr fid is a value, not its file:
// Tremove and Trename of it change no file.
func TestShortRequestsAndXattrFids(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("data"), 0o644)
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	for _, typ := range []uint8{tStatfs, tReadlink, tFsync} {
		if e, err := lerror(r.rpc(t, frame(typ, 1, uint16(0)))); err != nil || e != uint32(linux.EINVAL) {
			t.Errorf("type %d without its fid: errno %d %v, want EINVAL", typ, e, err)
		}
	}
	r.must(t, "walk", twalk(1, 0, 1, "f"))
	for _, m := range []struct {
		what string
		msg  []byte
	}{
		{"rename", frame(tRename, 1, uint32(2), uint32(0), "g")},
		{"remove", frame(tRemove, 1, uint32(2))},
	} {
		r.must(t, "xattrwalk", frame(tXattrwalk, 1, uint32(1), uint32(2), ""))
		if e, err := lerror(r.rpc(t, m.msg)); err != nil || e != uint32(linux.EOPNOTSUPP) {
			t.Errorf("%s of an xattr fid: errno %d %v, want EOPNOTSUPP", m.what, e, err)
		}
		if b, err := os.ReadFile(filepath.Join(f.dir, "f")); err != nil || string(b) != "data" {
			t.Fatalf("after the %s of an xattr fid, f: %q %v", m.what, b, err)
		}
		r.rpc(t, frame(tClunk, 1, uint32(2))) // the rename's; the remove's is gone already
	}
}
