package volume

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shalefs/shale/layer"
)

func TestParseURL(t *testing.T) {
	u, err := ParseURL("etcd://a:1,b/vol?cacert=/c")
	if err != nil || u.Name != "vol" || len(u.Etcd.Endpoints) != 2 || u.Etcd.Endpoints[1] != "b:2379" || u.Etcd.CACert != "/c" {
		t.Fatalf("%+v %v", u, err)
	}
	for _, bad := range []string{"etcd:///v", "etcd://a:1/", "etcd://a/b/c", "etcd://a/v?x=1", "9p://a/v"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	d, err := ParseDataURL("s3://host:9000/bucket/a/b")
	if err != nil || d.Bucket != "bucket" || d.Prefix != "a/b" || !d.Secure || d.String() != "s3://host:9000/bucket/a/b" {
		t.Fatalf("%+v %v", d, err)
	}
	if _, err := ParseDataURL("s3://host"); err == nil {
		t.Error("no bucket: no error")
	}
}

// TestFormatTwice: a name is made once.
func TestFormatTwice(t *testing.T) {
	lower := testVolume(t, 4096)
	u, _ := ParseURL(lower)
	_, s3 := engines(t)
	d, _ := ParseDataURL(s3)
	if _, err := Create(ctx0, u, FormatOptions{Data: d}); err == nil {
		t.Fatal("second format of one name succeeded")
	}
}

// TestData writes across blocks, reads back, truncates and regrows:
// the cut tail reads as zeros, and a second client reads what the first
// wrote back.
func TestData(t *testing.T) {
	lower := testVolume(t, 4096)
	_, root := mount(t, lower)
	data := make([]byte, 3*4096+100)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	f := writeFile(t, root, "f", data)
	if got := readFile(t, f); !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, differing", len(got))
	}
	// A partial overwrite in the middle of a stored block.
	h, e := f.Open(ctx0, syscall.O_RDWR)
	must(t, e)
	_, e = h.Write(ctx0, []byte("hello"), 5000)
	must(t, e)
	must(t, h.Flush(ctx0, 1))
	must(t, h.Release(ctx0))
	copy(data[5000:], "hello")
	// Truncate into block 1, then grow: bytes past the cut are zeros.
	var a layer.Attr
	must(t, f.Setattr(ctx0, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 4500}, &a))
	must(t, f.Setattr(ctx0, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 9000}, &a))
	want := append(bytes.Clone(data[:4500]), make([]byte, 9000-4500)...)
	_, root2 := mount(t, lower)
	if got := readFile(t, lookup(t, root2, "f")); !bytes.Equal(got, want) {
		t.Fatalf("second client read %d bytes, differing from the %d wanted", len(got), len(want))
	}
	if a := attr(t, f); a.Size != 9000 {
		t.Fatalf("size %d, want 9000", a.Size)
	}
}

// TestNamespace: link counts, rename across directories, replace, loops.
func TestNamespace(t *testing.T) {
	lower := testVolume(t, 4096)
	_, root := mount(t, lower)
	var a layer.Attr
	d1, e := root.Mkdir(ctx0, "d1", 0o755, &a)
	must(t, e)
	d2, e := root.Mkdir(ctx0, "d2", 0o755, &a)
	must(t, e)
	sub, e := d1.Mkdir(ctx0, "sub", 0o755, &a)
	must(t, e)
	if n := attr(t, root).Nlink; n != 4 {
		t.Fatalf("root nlink %d, want 4", n)
	}
	f := writeFile(t, d1, "f", []byte("x"))
	_, e = d2.Link(ctx0, f, "g", &a)
	must(t, e)
	if a.Nlink != 2 {
		t.Fatalf("nlink after link %d", a.Nlink)
	}
	must(t, d1.Rename(ctx0, "sub", d2, "sub", 0))
	if attr(t, d1).Nlink != 2 || attr(t, d2).Nlink != 3 {
		t.Fatalf("nlinks after moving a directory: %d %d", attr(t, d1).Nlink, attr(t, d2).Nlink)
	}
	if e := d2.Rename(ctx0, "sub", sub, "x", 0); e != syscall.EINVAL {
		t.Fatalf("moving a directory into itself: %v", e)
	}
	// Replace: g (a link of f) replaced by a new file h.
	writeFile(t, d2, "h", []byte("y"))
	must(t, d2.Rename(ctx0, "h", d2, "g", 0))
	if n := attr(t, f).Nlink; n != 1 {
		t.Fatalf("nlink of f after its other link was replaced: %d", n)
	}
	if e := d1.Rmdir(ctx0, "nothing"); e != syscall.ENOENT {
		t.Fatal(e)
	}
	if e := root.Rmdir(ctx0, "d2"); e != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a full directory: %v", e)
	}
	must(t, d2.Unlink(ctx0, "g"))
	must(t, d2.Rmdir(ctx0, "sub"))
	must(t, root.Rmdir(ctx0, "d2"))
	if n := attr(t, root).Nlink; n != 3 {
		t.Fatalf("root nlink %d, want 3", n)
	}
	u, _ := ParseURL(lower)
	if bad, err := Fsck(ctx0, u); err != nil || len(bad) > 0 {
		t.Fatalf("fsck: %v\n%s", err, FsckReport(bad))
	}
	// fsck sees what is wrong: an entry without its inode.
	fs, _ := FSOf(root)
	fs.eng.Txn(ctx0, func(tx Tx) error {
		tx.Put(fs.k.dirent(rootIno, "dangling"), mustJSON(Dirent{Ino: 999999, Type: syscall.S_IFREG}))
		return nil
	})
	if bad, err := Fsck(ctx0, u); err != nil || len(bad) != 2 {
		t.Fatalf("fsck of a dangling entry: %v\n%s (want it and the root's count)", err, FsckReport(bad))
	}
}

// TestConcurrentRenames: two clients move files between directories at
// once; every move is one transaction, so no file is lost or doubled and
// the directories' counts stay exact.
func TestConcurrentRenames(t *testing.T) {
	lower := testVolume(t, 4096)
	_, r1 := mount(t, lower)
	_, r2 := mount(t, lower)
	var a layer.Attr
	_, e := r1.Mkdir(ctx0, "a", 0o755, &a)
	must(t, e)
	_, e = r1.Mkdir(ctx0, "b", 0o755, &a)
	must(t, e)
	const files = 10
	for i := range files {
		writeFile(t, lookup(t, r1, "a"), fmt.Sprint(i), nil)
	}
	var wg sync.WaitGroup
	for _, r := range []layer.Node{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			da, db := lookup(t, r, "a"), lookup(t, r, "b")
			for range 60 {
				i := fmt.Sprint(rand.IntN(files))
				if rand.IntN(2) == 0 {
					da.Rename(ctx0, i, db, i, 0)
				} else {
					db.Rename(ctx0, i, da, i, 0)
				}
			}
		}()
	}
	wg.Wait()
	count := func(d layer.Node) int {
		s, e := d.OpenDir(ctx0)
		must(t, e)
		n := 0
		for {
			ent, ok, e := s.Next(ctx0)
			must(t, e)
			if !ok {
				return n
			}
			if ent.Name != "." && ent.Name != ".." {
				n++
			}
		}
	}
	da, db := lookup(t, r1, "a"), lookup(t, r1, "b")
	if n := count(da) + count(db); n != files {
		t.Fatalf("%d files after the renames, want %d", n, files)
	}
	u, _ := ParseURL(lower)
	if bad, err := Fsck(ctx0, u); err != nil || len(bad) > 0 {
		t.Fatalf("fsck: %v\n%s", err, FsckReport(bad))
	}
	fs, _ := FSOf(da)
	for _, d := range []layer.Node{da, db} {
		in, err := fs.getInode(ctx0, d.Token().Ino)
		if err != nil {
			t.Fatal(err)
		}
		if int(in.Entries) != count(d) {
			t.Fatalf("directory counts %d entries, lists %d", in.Entries, count(d))
		}
	}
}

// TestXattr: create/replace flags, list, remove.
func TestXattr(t *testing.T) {
	lower := testVolume(t, 4096)
	_, root := mount(t, lower)
	f := writeFile(t, root, "f", nil)
	must(t, f.Setxattr(ctx0, "user.a", []byte("1"), 0))
	if e := f.Setxattr(ctx0, "user.a", []byte("2"), 1 /* XATTR_CREATE */); e != syscall.EEXIST {
		t.Fatal(e)
	}
	if e := f.Setxattr(ctx0, "user.b", []byte("2"), 2 /* XATTR_REPLACE */); e != syscall.ENODATA {
		t.Fatal(e)
	}
	must(t, f.Setxattr(ctx0, "user.b", []byte("22"), 0))
	buf := make([]byte, 100)
	k, e := f.Listxattr(ctx0, buf)
	must(t, e)
	if string(buf[:k]) != "user.a\x00user.b\x00" {
		t.Fatalf("list %q", buf[:k])
	}
	k, e = f.Getxattr(ctx0, "user.b", buf)
	must(t, e)
	if string(buf[:k]) != "22" {
		t.Fatal(string(buf[:k]))
	}
	must(t, f.Removexattr(ctx0, "user.a"))
	if _, e := f.Getxattr(ctx0, "user.a", buf); e != syscall.ENODATA {
		t.Fatal(e)
	}
}

// TestOpenUnlinked: a file whose last link goes while it is open here
// stays, without links, until its last close (its attributes and data
// still change); a client that dies with it open leaves it to gc, once
// its lease is gone.
func TestOpenUnlinked(t *testing.T) {
	lower := testVolume(t, 4096)
	fs, root := mount(t, lower)
	f := writeFile(t, root, "f", []byte("before"))
	h, e := f.Open(ctx0, syscall.O_RDWR)
	must(t, e)
	must(t, root.Unlink(ctx0, "f"))
	var a layer.Attr
	must(t, f.Setattr(ctx0, h, &layer.SetAttr{Valid: layer.SetMode | layer.SetSize, Mode: 0o600, Size: 3}, &a))
	if a.Nlink != 0 || a.Mode&0o777 != 0o600 || a.Size != 3 {
		t.Fatalf("fchmod and ftruncate of the open unlinked file: nlink %d mode %o size %d", a.Nlink, a.Mode&0o777, a.Size)
	}
	_, e = h.Write(ctx0, []byte("++"), 3)
	must(t, e)
	buf := make([]byte, 10)
	n, e := h.Read(ctx0, buf, 0)
	must(t, e)
	if string(buf[:n]) != "bef++" {
		t.Fatalf("read %q", buf[:n])
	}
	must(t, f.Setxattr(ctx0, "user.x", []byte("1"), 0))
	must(t, h.Flush(ctx0, 1))
	must(t, h.Release(ctx0))
	if _, err := fs.getInode(ctx0, f.Token().Ino); err != syscall.ENOENT {
		t.Fatalf("after the last close the inode is still there: %v", err)
	}

	// A client that dies with the file open: its lease ends (revoked
	// here, as its expiry would), and gc removes the file.
	fs2, root2 := mount(t, lower)
	g := writeFile(t, root2, "g", []byte("data"))
	h2, e := g.Open(ctx0, 0)
	must(t, e)
	must(t, root2.Unlink(ctx0, "g"))
	u, _ := ParseURL(lower)
	if r, err := GC(ctx0, u, 0); err != nil || r.Inodes != 0 {
		t.Fatalf("gc while the file is open: %+v %v", r, err)
	}
	lease, _ := fs2.eng.Lease(ctx0)
	if _, err := fs2.eng.(*etcdEngine).c.Revoke(ctx0, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	r, err := GC(ctx0, u, 0)
	if err != nil || r.Inodes != 1 {
		t.Fatalf("gc after the client's lease ended: %+v %v, want 1 inode removed", r, err)
	}
	if _, err := fs.getInode(ctx0, g.Token().Ino); err != syscall.ENOENT {
		t.Fatalf("the orphan is still there: %v", err)
	}
	_ = h2
}

// TestUncheckedCallers: a caller no frontend checked (9P) gets EACCES
// unless root: the volume checks no permissions itself yet.
func TestUncheckedCallers(t *testing.T) {
	lower := testVolume(t, 4096)
	_, root := mount(t, lower)
	writeFile(t, root, "f", []byte("x"))
	nobody := layer.WithCaller(ctx0, layer.Caller{Uid: 65534, Gid: 65534, Check: true})
	var a layer.Attr
	if _, e := root.Lookup(nobody, "f", &a); e != syscall.EACCES {
		t.Fatalf("lookup by an unchecked caller: %v, want EACCES", e)
	}
	if _, e := root.Mkdir(nobody, "d", 0o777, &a); e != syscall.EACCES {
		t.Fatalf("mkdir by an unchecked caller: %v, want EACCES", e)
	}
	rootCaller := layer.WithCaller(ctx0, layer.Caller{Check: true})
	if _, e := root.Lookup(rootCaller, "f", &a); e != 0 {
		t.Fatalf("lookup by unchecked root: %v", e)
	}
}

// TestPrefetchDropped: what a listing read for the lookups after it is
// dropped when another client changes the file, so a lookup after the
// change's delivery finds the new attributes, not the listing's.
func TestPrefetchDropped(t *testing.T) {
	lower := testVolume(t, 4096)
	_, r1 := mount(t, lower)
	f := writeFile(t, r1, "f", []byte("x"))
	// Mounted after: its watch starts past the creation, so the only
	// event about f it can see is the chmod's.
	fs2, r2 := mount(t, lower)
	told := make(chan struct{}, 16)
	fs2.st.Events().Subscribe(func(ev layer.Event) {
		if ev.Token == f.Token() {
			told <- struct{}{}
		}
	})
	s, e := r2.OpenDir(ctx0) // reads f's inode for the lookups to come
	must(t, e)
	s.Close()
	var a layer.Attr
	must(t, f.Setattr(ctx0, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o600}, &a))
	select {
	case <-told:
	case <-time.After(20 * time.Second):
		t.Fatal("the chmod never reached the other client")
	}
	if _, e := r2.Lookup(ctx0, "f", &a); e != 0 || a.Mode&0o777 != 0o600 {
		t.Fatalf("lookup after the change was delivered: mode %o, %v; want 600", a.Mode&0o777, e)
	}
}
