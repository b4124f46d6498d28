package export

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

const nobodyUid = 65534

// create makes name in dir and returns it opened read-write.
func create(t *testing.T, dir p9.File, name string, mode p9.FileMode) p9.File {
	t.Helper()
	d := walk(t, dir)
	f, _, _, err := d.Create(name, p9.ReadWrite, mode, p9.NoUID, p9.NoGID)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return f
}

func TestFiles(t *testing.T) {
	f := newFixture(t, Options{})
	os.Chmod(f.dir, 0o777) // the library's client attaches as nobody
	s := f.dial(t, "")

	// Create, write, read back; the host sees the bytes.
	fl := create(t, s.root, "a", 0o640)
	if n, err := fl.WriteAt([]byte("hello, 9p"), 0); err != nil || n != 9 {
		t.Fatalf("write: %d %v", n, err)
	}
	buf := make([]byte, 64)
	if n, err := fl.ReadAt(buf, 7); n != 2 || string(buf[:n]) != "9p" {
		t.Fatalf("read: %q %v", buf[:n], err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.dir, "a")); string(b) != "hello, 9p" {
		t.Fatalf("host sees %q", b)
	}
	if err := fl.FSync(); err != nil {
		t.Fatal(err)
	}
	fl.Close()

	// Getattr: QID path is the token's inode, Gen is the token's.
	a := walk(t, s.root, "a")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(f.dir, "a"), &st); err != nil {
		t.Fatal(err)
	}
	qid, mask, attr, err := a.GetAttr(p9.AttrMaskAll)
	if err != nil {
		t.Fatal(err)
	}
	tok := lookupToken(t, f, "a")
	if qid.Path != st.Ino || qid.Type != p9.TypeRegular || attr.Size != 9 || attr.Mode != p9.ModeRegular|0o640 || !mask.Gen || attr.Gen != tok.Gen || attr.NLink != 1 {
		t.Fatalf("getattr: %v %v %v (ino %d, token %v)", qid, mask, attr, st.Ino, tok)
	}

	// Setattr: size, mode, times.
	if err := a.SetAttr(p9.SetAttrMask{Size: true, Permissions: true, MTime: true, MTimeNotSystemTime: true},
		p9.SetAttr{Size: 5, Permissions: 0o600, MTimeSeconds: 1000000000, MTimeNanoSeconds: 5}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(f.dir, "a"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 5 || st.Mode&0o7777 != 0o600 || st.Mtim.Sec != 1000000000 || st.Mtim.Nsec != 5 {
		t.Fatalf("after setattr: size %d mode %o mtime %v", st.Size, st.Mode, st.Mtim)
	}
	a.Close()

	// Mkdir, symlink and readlink, link, mknod.
	if _, err := s.root.Mkdir("d", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.root.Symlink("a", "sl", p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	sl := walk(t, s.root, "sl")
	if target, err := sl.Readlink(); err != nil || target != "a" {
		t.Fatalf("readlink: %q %v", target, err)
	}
	sl.Close()
	a = walk(t, s.root, "a")
	if err := s.root.Link(a, "hard"); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := s.root.Mknod("fifo", p9.ModeNamedPipe|0o600, 0, 0, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(f.dir, "fifo"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Fatalf("mknod: %o %v", st.Mode, err)
	}
	if err := unix.Stat(filepath.Join(f.dir, "hard"), &st); err != nil || st.Nlink != 2 {
		t.Fatalf("link: nlink %d %v", st.Nlink, err)
	}

	// Renameat, and Trename (the library turns it into RenameAt).
	d := walk(t, s.root, "d")
	if err := s.root.RenameAt("hard", d, "moved"); err != nil {
		t.Fatal(err)
	}
	moved := walk(t, d, "moved")
	if err := moved.Rename(s.root, "back"); err != nil {
		t.Fatal(err)
	}
	moved.Close()
	if _, err := os.Stat(filepath.Join(f.dir, "back")); err != nil {
		t.Fatal(err)
	}

	// Unlinkat, and rmdir with AT_REMOVEDIR; errors keep their errno.
	if err := s.root.UnlinkAt("d", 0); !errors.Is(err, linux.EISDIR) && !errors.Is(err, linux.EPERM) {
		t.Fatalf("unlink of a directory: %v", err)
	}
	if _, err := d.Mkdir("sub", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if err := s.root.UnlinkAt("d", unix.AT_REMOVEDIR); !errors.Is(err, linux.ENOTEMPTY) {
		t.Fatalf("rmdir of a full directory: %v, want ENOTEMPTY", err)
	}
	if err := d.UnlinkAt("sub", unix.AT_REMOVEDIR); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := s.root.UnlinkAt("d", unix.AT_REMOVEDIR); err != nil {
		t.Fatal(err)
	}
	if err := s.root.UnlinkAt("back", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.root.Walk([]string{"back"}); !errors.Is(err, linux.ENOENT) {
		t.Fatalf("walk to a removed file: %v", err)
	}

	// Statfs reports the host's.
	fs, err := s.root.StatFS()
	if err != nil {
		t.Fatal(err)
	}
	var hs unix.Statfs_t
	unix.Statfs(f.dir, &hs)
	if fs.Blocks != hs.Blocks || fs.BlockSize != uint32(hs.Bsize) || fs.NameLength != 255 {
		t.Fatalf("statfs: %+v, host %+v", fs, hs)
	}
}

// lookupToken is the token hostfs gives name.
func lookupToken(t *testing.T, f *fixture, name string) layer.Token {
	var a layer.Attr
	n, e := f.host.Lookup(context.Background(), name, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	return n.Token()
}

// A listing of 1000 entries in small replies, resumed at offsets the
// server gave, and rewound: every name once, with its inode and type.
// Each reply but the last is full (journal.FillsReaddir): without room
// for the longest entry.
func TestReaddir(t *testing.T) {
	f := newFixture(t, Options{})
	want := []string{".", ".."}
	for i := range 1000 {
		name := fmt.Sprintf("file-%04d", i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(f.dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(f.dir, "sub"), 0o755)
	want = append(want, "sub")
	slices.Sort(want)
	s := f.dial(t, "")
	d := walk(t, s.root)
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	list := func(from uint64) (names []string, offs []uint64) {
		off, short := from, false
		for {
			ents, err := d.Readdir(off, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) == 0 {
				return names, offs
			}
			if short {
				t.Fatalf("a reply with room for another entry was not the last: %d entries after it", len(ents))
			}
			used := 0
			for _, e := range ents {
				used += direntSize(e.Name)
			}
			short = used+journal.MaxDirent <= 1000
			for _, e := range ents {
				names = append(names, e.Name)
				offs = append(offs, e.Offset)
				if e.Name == "sub" && uint8(e.Type) != unix.DT_DIR { // d_type, as Linux reads it
					t.Errorf("sub has type %v", e.Type)
				}
				if e.Name == "file-0007" {
					var st unix.Stat_t
					unix.Stat(filepath.Join(f.dir, e.Name), &st)
					if e.QID.Path != st.Ino {
						t.Errorf("file-0007: qid path %d, inode %d", e.QID.Path, st.Ino)
					}
				}
			}
			off = ents[len(ents)-1].Offset
		}
	}
	names, offs := list(0)
	got := slices.Sorted(slices.Values(names))
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d names, want %d", len(got), len(want))
	}
	// Resume in the middle: the rest, in the same order.
	rest, _ := list(offs[499])
	if !slices.Equal(rest, names[500:]) {
		t.Fatalf("resumed listing: %d names, want %d", len(rest), len(names)-500)
	}
	// From the start again.
	again, _ := list(0)
	if !slices.Equal(again, names) {
		t.Fatal("second listing differs")
	}
	// A count too small for one entry is an error, not the end.
	if _, err := d.Readdir(0, 10); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("readdir with count 10: %v", err)
	}
}

// A listing whose stream fails midway answers the error, not the entries
// read before it: a reply cut short would say the listing ended
// (journal.FillsReaddir). The same Treaddir again lists everything.
func TestReaddirErrorNotShort(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(f.dir, fmt.Sprintf("f%02d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := f.dial(t, "")
	d := walk(t, s.root)
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	f.c.dirFail.Store(5)
	if ents, err := d.Readdir(0, 64<<10); !errors.Is(err, linux.EIO) {
		t.Fatalf("a stream failing after 5 entries: %d entries, error %v; want EIO", len(ents), err)
	}
	ents, err := d.Readdir(0, 64<<10)
	if err != nil || len(ents) != 22 {
		t.Fatalf("listed again: %d entries, error %v; want 22", len(ents), err)
	}
	// The journal tree's root says the server fills its replies.
	j := f.dial(t, journal.Aname)
	q, _, _, err := j.root.GetAttr(p9.AttrMask{})
	if err != nil || q.Version&journal.FillsReaddir == 0 {
		t.Fatalf("the journal root's QID version %#x (%v) lacks FillsReaddir", q.Version, err)
	}
}

// Xattrs go through the raw protocol: the library's client has none.
func TestXattrs(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	os.Mkdir(filepath.Join(f.dir, "d"), 0o755)
	os.WriteFile(filepath.Join(f.dir, "d", "x"), nil, 0o644)
	host := filepath.Join(f.dir, "d", "x")
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	// fid 1: d; fid 2: d/x.
	r.must(t, "walk d", twalk(2, 0, 1, "d"))
	r.must(t, "walk x", twalk(2, 1, 2, "x"))

	// Set through a clone: Txattrcreate, Twrite, Tclunk.
	r.must(t, "clone", twalk(2, 2, 3))
	r.must(t, "xattrcreate", frame(tXattrcreate, 3, uint32(3), "user.color", uint64(4), uint32(0)))
	r.must(t, "write", frame(tWrite, 3, uint32(3), uint64(0), uint32(4), []byte("blue")))
	r.must(t, "clunk", frame(tClunk, 3, uint32(3)))
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(host, "user.color", buf); err != nil || string(buf[:n]) != "blue" {
		t.Fatalf("host xattr: %q %v", buf[:n], err)
	}

	// Get: Txattrwalk gives the size, Tread the value.
	for range 3 { // repeatedly: each makes and clunks an xattr fid
		body := r.must(t, "xattrwalk", frame(tXattrwalk, 4, uint32(2), uint32(4), "user.color"))
		if size := binary.LittleEndian.Uint64(body); size != 4 {
			t.Fatalf("xattr size %d", size)
		}
		body = r.must(t, "read", frame(tRead, 4, uint32(4), uint64(0), uint32(4)))
		if string(body[4:]) != "blue" {
			t.Fatalf("xattr value %q", body[4:])
		}
		r.must(t, "clunk", frame(tClunk, 4, uint32(4)))
	}
	// List.
	body := r.must(t, "xattrwalk list", frame(tXattrwalk, 4, uint32(2), uint32(4), ""))
	size := binary.LittleEndian.Uint64(body)
	body = r.must(t, "read list", frame(tRead, 4, uint32(4), uint64(0), uint32(size)))
	if !strings.Contains(string(body[4:]), "user.color\x00") {
		t.Fatalf("xattr list %q", body[4:])
	}
	r.must(t, "clunk", frame(tClunk, 4, uint32(4)))
	// A missing one is ENODATA.
	if e, err := lerror(r.rpc(t, frame(tXattrwalk, 4, uint32(2), uint32(4), "user.none"))); err != nil || e != uint32(linux.ENODATA) {
		t.Fatalf("xattrwalk of a missing xattr: %d %v", e, err)
	}
	// Remove: Txattrcreate with size 0 and XATTR_REPLACE.
	r.must(t, "clone", twalk(2, 2, 3))
	r.must(t, "xattrcreate remove", frame(tXattrcreate, 3, uint32(3), "user.color", uint64(0), uint32(p9.XattrReplace)))
	r.must(t, "clunk", frame(tClunk, 3, uint32(3)))
	if _, err := unix.Getxattr(host, "user.color", buf); err != unix.ENODATA {
		t.Fatalf("removed xattr: %v", err)
	}

	// The directory fid still serves after those xattr fids (hugelgupf/p9's
	// server lost count of it).
	r.must(t, "walk from d after xattr fids", twalk(5, 1, 6, "x"))
	r.must(t, "clunk", frame(tClunk, 5, uint32(6)))
	r.must(t, "clunk x", frame(tClunk, 5, uint32(2)))
	r.must(t, "walk from d after x is gone", twalk(5, 1, 6, "x"))
	r.must(t, "getattr", frame(tGetattr, 5, uint32(1), uint64(0x3fff)))

	// And the connection's end leaves nothing.
	r.c.Close()
	<-r.done
	f.c.check(t)
}

// Permissions are the host kernel's, for the attaching uid: root is
// squashed to nobody unless NoRootSquash.
func TestPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to other users needs root")
	}
	for _, tc := range []struct {
		name     string
		opts     Options
		uid      uint32
		wantRoot bool // may write the root-owned directory
		wantUid  uint32
	}{
		{"nobody", Options{}, nobodyUid, false, nobodyUid},
		{"root squashed", Options{}, 0, false, nobodyUid},
		{"root", Options{NoRootSquash: true}, 0, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.opts)
			os.Chmod(f.dir, 0o755)
			os.Mkdir(filepath.Join(f.dir, "open"), 0o777)
			os.WriteFile(filepath.Join(f.dir, "secret"), []byte("s"), 0o600)
			r := f.rawDial(t)
			r.handshake(t, 64<<10, tc.uid)
			r.must(t, "clone", twalk(1, 0, 1))
			typ, body := r.rpc(t, frame(tLcreate, 1, uint32(1), "new", uint32(2), uint32(0o644), ^uint32(0)))
			if e, _ := lerror(typ, body); tc.wantRoot != (typ != rLerror) || typ == rLerror && e != uint32(linux.EACCES) {
				t.Fatalf("create in a root-owned 0755 directory: errno %d, want EACCES unless root", e)
			}
			r.must(t, "walk", twalk(1, 0, 2, "secret"))
			if typ, _ := r.rpc(t, frame(tLopen, 1, uint32(2), uint32(0))); tc.wantRoot != (typ != rLerror) {
				t.Fatalf("open of a root-owned 0600 file: reply %d", typ)
			}
			// Created files belong to the caller.
			r.must(t, "walk", twalk(1, 0, 3, "open"))
			r.must(t, "create", frame(tLcreate, 1, uint32(3), "mine", uint32(2), uint32(0o644), ^uint32(0)))
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(f.dir, "open", "mine"), &st); err != nil || st.Uid != tc.wantUid {
				t.Fatalf("created file owned by %d (%v), want %d", st.Uid, err, tc.wantUid)
			}
			// The gid of Tmkdir is taken from a caller in that group
			// (root is in all), and ignored otherwise.
			r.must(t, "walk", twalk(1, 0, 4, "open"))
			r.must(t, "mkdir", frame(tMkdir, 1, uint32(4), "g", uint32(0o755), uint32(1234)))
			wantGid := uint32(nobodyUid)
			if tc.wantUid == 0 {
				wantGid = 1234
			}
			if err := unix.Stat(filepath.Join(f.dir, "open", "g"), &st); err != nil || st.Gid != wantGid {
				t.Fatalf("mkdir with gid 1234: group %d (%v), want %d", st.Gid, err, wantGid)
			}
		})
	}
}

// Attach names reach roots; names with '/' go through synthetic
// directories; unknown names fail.
func TestAttachNames(t *testing.T) {
	f := newFixture(t, Options{})
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "o"), []byte("other"), 0o644)
	os.WriteFile(filepath.Join(f.dir, "d"), []byte("default"), 0o644)
	or, err := hostfs.New(f.st, other)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(or.Forget)
	f.s = New(f.st, map[string]layer.Node{"": f.root, "/a/b/": or}, Options{})
	read := func(dir p9.File, name string) string {
		fl := walk(t, dir, name)
		defer fl.Close()
		if _, _, err := fl.Open(p9.ReadOnly); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16)
		n, _ := fl.ReadAt(buf, 0)
		return string(buf[:n])
	}
	if got := read(f.dial(t, "/").root, "d"); got != "default" {
		t.Fatalf("attach /: %q", got)
	}
	if got := read(f.dial(t, "a/b").root, "o"); got != "other" {
		t.Fatalf("attach a/b: %q", got)
	}
	// From the default root, a/b is reached as a path, like a mount.
	s := f.dial(t, "")
	if got := read(walk(t, s.root, "a", "b"), "o"); got != "other" {
		t.Fatalf("a/b from the default root: %q", got)
	}
	// The synthetic directory a lists b.
	a := walk(t, s.root, "a")
	if _, _, err := a.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	if ents, err := a.Readdir(0, 1000); err != nil || len(ents) != 1 || ents[0].Name != "b" {
		t.Fatalf("listing of a: %v %v", ents, err)
	}
	if _, err := f.tryDial("nope"); !errors.Is(err, linux.ENOENT) {
		t.Fatalf("attach of an unknown name: %v", err)
	}
}

// A FUSE view of the same stack sees at once what is written over 9P,
// though it caches for an hour: the export is a view of the stack's
// coherence manager.
func TestCoherenceWithFUSE(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE needs root")
	}
	f := newFixture(t, Options{})
	os.Chmod(f.dir, 0o777) // the library's client attaches as nobody
	os.WriteFile(filepath.Join(f.dir, "f"), []byte("old"), 0o666)
	mnt := t.TempDir()
	srv, err := fuseview.Mount(mnt, f.st, f.host, fuseview.Options{Timeout: time.Hour, Coherent: true, KeepCache: true, Source: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "old" {
		t.Fatalf("fuse read: %q %v", b, err)
	}
	s := f.dial(t, "")
	fl := walk(t, s.root, "f")
	if _, _, err := fl.Open(p9.WriteOnly | 0o1000); err != nil { // O_TRUNC
		t.Fatal(err)
	}
	if _, err := fl.WriteAt([]byte("new!"), 0); err != nil {
		t.Fatal(err)
	}
	// The connection's own view, so that the manager skips only it.
	if v, want := f.c.view.Load(), f.s.connViews(); len(want) != 1 || v != want[0] {
		t.Fatalf("write over 9P as view %d, want the connection's (of %v)", v, want)
	}
	if _, err := s.root.Mkdir("dir", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(b) != "new!" {
		t.Fatalf("fuse read after the 9P write: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(mnt, "dir")); err != nil || !st.IsDir() {
		t.Fatalf("fuse stat of a directory made over 9P: %v", err)
	}
}

// An open file that has been unlinked still takes fchmod, ftruncate and
// fsetxattr, as POSIX has it.
func TestUnlinkedOpenFile(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.must(t, "clone", twalk(1, 0, 1))
	r.must(t, "create", frame(tLcreate, 1, uint32(1), "u", uint32(2), uint32(0o644), ^uint32(0)))
	r.must(t, "write", frame(tWrite, 1, uint32(1), uint64(0), uint32(5), []byte("hello")))
	r.must(t, "unlink", frame(tUnlinkat, 1, uint32(0), "u", uint32(0)))
	r.must(t, "fchmod", frame(tSetattr, 1, uint32(1), uint32(1), uint32(0o600), uint32(0), uint32(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0)))
	r.must(t, "ftruncate", frame(tSetattr, 1, uint32(1), uint32(8), uint32(0), uint32(0), uint32(0), uint64(2), uint64(0), uint64(0), uint64(0), uint64(0)))
	body := r.must(t, "getattr", frame(tGetattr, 1, uint32(1), uint64(0x3fff)))
	d := p9wire.Dec{B: body}
	if a := d.Getattr().Attr; a.Mode&0o7777 != 0o600 || a.Size != 2 || a.Nlink != 0 {
		t.Fatalf("after fchmod and ftruncate: mode %o size %d nlink %d", a.Mode, a.Size, a.Nlink)
	}
	r.must(t, "clone for xattr", twalk(1, 1, 2))
	r.must(t, "xattrcreate", frame(tXattrcreate, 1, uint32(2), "user.k", uint64(1), uint32(0)))
	r.must(t, "write xattr", frame(tWrite, 1, uint32(2), uint64(0), uint32(1), []byte("v")))
	r.must(t, "fsetxattr", frame(tClunk, 1, uint32(2)))
	body = r.must(t, "fgetxattr", frame(tXattrwalk, 1, uint32(1), uint32(3), "user.k"))
	if size := binary.LittleEndian.Uint64(body); size != 1 {
		t.Fatalf("xattr size %d", size)
	}
}

// A file without xattrs lists none: an empty list, not one empty name.
func TestEmptyXattrList(t *testing.T) {
	f := newFixture(t, Options{NoRootSquash: true})
	host := filepath.Join(f.dir, "x")
	os.WriteFile(host, nil, 0o644)
	n, err := unix.Listxattr(host, nil)
	if err != nil {
		t.Skip(err)
	}
	r := f.rawDial(t)
	r.handshake(t, 64<<10, 0)
	r.must(t, "walk", twalk(1, 0, 1, "x"))
	body := r.must(t, "xattrwalk list", frame(tXattrwalk, 1, uint32(1), uint32(2), ""))
	if size := binary.LittleEndian.Uint64(body); size != uint64(n) {
		t.Fatalf("list size %d, host %d", size, n)
	}
}

// ".." walks up, but never above the attach.
func TestWalkDotDot(t *testing.T) {
	f := newFixture(t, Options{})
	os.MkdirAll(filepath.Join(f.dir, "d", "e"), 0o755)
	r := f.rawDial(t)
	r.handshake(t, 64<<10, nobodyUid)
	qids := func(body []byte) []p9wire.Qid {
		d := p9wire.Dec{B: body}
		q := make([]p9wire.Qid, d.U16())
		for i := range q {
			q[i] = d.Qid()
		}
		return q
	}
	root := qids(r.must(t, "walk .", twalk(1, 0, 9, "d", "..")))[1]
	q := qids(r.must(t, "walk", twalk(1, 0, 1, "d", "e", "..", "..", "..", "d")))
	if len(q) != 6 || q[2] != q[0] || q[3] != root || q[4] != root || q[5] != q[0] {
		t.Fatalf("walk d/e/../../../d: %v (root %v)", q, root)
	}
	// From a fid walked before: its path is kept.
	r.must(t, "walk e", twalk(1, 1, 2, "e"))
	if q := qids(r.must(t, "walk ..", twalk(1, 2, 3, ".."))); q[0] != qids(r.must(t, "walk d", twalk(1, 0, 4, "d")))[0] {
		t.Fatal("e/.. is not d")
	}
	// An attach below a root stops there.
	r.must(t, "attach d", frame(tAttach, 1, uint32(5), ^uint32(0), "", "d", uint32(nobodyUid)))
	q = qids(r.must(t, "walk .. from d", twalk(1, 5, 6, "..")))
	if q[0] != qids(r.must(t, "walk d", twalk(1, 0, 7, "d")))[0] {
		t.Fatal("walked above the attach")
	}
}
