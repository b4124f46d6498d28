package remote

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Requests run as the caller: diod creates as the attaching uid, with the
// caller's gid, and the client applies the umask 9P lacks.
func TestIdentity(t *testing.T) {
	srv := newDiod(t)
	root, _ := mount(t, srv)
	var a layer.Attr
	nobody := as(65534, 65534, 0o027)
	_, h, e := root.Create(nobody, "mine", unix.O_RDWR, 0o666, &a)
	must(t, e, "create as nobody")
	h.Release(nobody)
	st, err := os.Lstat(filepath.Join(srv.dir, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Uid != 65534 || sys.Gid != 65534 || st.Mode().Perm() != 0o640 {
		t.Fatalf("created %v uid %d gid %d, want 0640 65534 65534", st.Mode(), sys.Uid, sys.Gid)
	}
	// Each caller acts through fids of its own attach. (diod keeps root's
	// capabilities when it acts for another uid, so it does not refuse
	// nobody a write into root's directory: the fids are what is checked.)
	_, e = root.Mkdir(bg, "roots", 0o755, &a)
	must(t, e, "mkdir as root")
	d := lookup(t, root, "roots").(*node)
	must(t, d.Getattr(nobody, nil, &a), "getattr as nobody")
	d.mu.Lock()
	f0, f1 := d.fids[whoOf(bg)], d.fids[whoOf(nobody)]
	d.mu.Unlock()
	if f0 == nil || f1 == nil || f0.Num() == f1.Num() {
		t.Fatalf("fids of root and nobody: %v %v", f0, f1)
	}
	r0, _ := f0.Conn().Root(whoOf(bg))
	r1, _ := f0.Conn().Root(whoOf(nobody))
	if r0 == r1 {
		t.Fatal("one attach for two uids")
	}

	// A default ACL: the umask does not apply.
	acl := []byte{2, 0, 0, 0, // POSIX_ACL_XATTR_VERSION
		1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // USER_OBJ rwx
		4, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // GROUP_OBJ rwx
		0x20, 0, 7, 0, 0xff, 0xff, 0xff, 0xff} // OTHER rwx
	if err := unix.Setxattr(srv.dir, "system.posix_acl_default", acl, 0); err != nil {
		t.Skipf("no ACLs here: %v", err)
	}
	_, e = root.Mkdir(nobody, "acl", 0o777, &a)
	must(t, e, "mkdir under a default ACL")
	if a.Mode&0o777 != 0o777 {
		t.Fatalf("mkdir under a default ACL gave %o, want 777 (the umask is the ACL's business)", a.Mode&0o777)
	}
}

func TestXattr(t *testing.T) {
	srv := newDiod(t)
	root, _ := mount(t, srv)
	var a layer.Attr
	f, h, e := root.Create(bg, "x", unix.O_RDWR, 0o644, &a)
	must(t, e, "create")
	h.Release(bg)
	if _, e := f.Getxattr(bg, "user.k", nil); e != syscall.ENODATA {
		t.Fatalf("missing xattr: %v", e)
	}
	must(t, f.Setxattr(bg, "user.k", []byte("value"), 0), "setxattr")
	if e := f.Setxattr(bg, "user.k", []byte("v2"), unix.XATTR_CREATE); e != syscall.EEXIST {
		t.Fatalf("XATTR_CREATE over one: %v", e)
	}
	k, e := f.Getxattr(bg, "user.k", nil)
	must(t, e, "getxattr size")
	if k != 5 {
		t.Fatalf("size %d", k)
	}
	if _, e := f.Getxattr(bg, "user.k", make([]byte, 2)); e != syscall.ERANGE {
		t.Fatalf("small buffer: %v", e)
	}
	buf := make([]byte, 64)
	k, e = f.Getxattr(bg, "user.k", buf)
	must(t, e, "getxattr")
	if string(buf[:k]) != "value" {
		t.Fatalf("got %q", buf[:k])
	}
	k, e = f.Listxattr(bg, buf)
	must(t, e, "listxattr")
	if !bytes.Contains(buf[:k], []byte("user.k\x00")) {
		t.Fatalf("list %q", buf[:k])
	}
	must(t, f.Removexattr(bg, "user.k"), "removexattr")
	if _, e := f.Getxattr(bg, "user.k", nil); e != syscall.ENODATA {
		t.Fatalf("after remove: %v", e)
	}
	if e := f.Removexattr(bg, "user.k"); e != syscall.ENODATA {
		t.Fatalf("removing a missing one: %v", e)
	}
}

// Locks are the server's: two clients conflict.
func TestLocks(t *testing.T) {
	srv := newDiod(t)
	r1, _ := mount(t, srv)
	r2, _ := mount(t, srv)
	var a layer.Attr
	_, h0, e := r1.Create(bg, "l", unix.O_RDWR, 0o644, &a)
	must(t, e, "create")
	h0.Release(bg)
	h1, e := lookup(t, r1, "l").Open(bg, unix.O_RDWR)
	must(t, e, "open 1")
	defer h1.Release(bg)
	h2, e := lookup(t, r2, "l").Open(bg, unix.O_RDWR)
	must(t, e, "open 2")
	defer h2.Release(bg)

	whole := func(typ uint32) *layer.Lock { return &layer.Lock{Type: typ, End: math.MaxUint64} }
	must(t, h1.Setlk(bg, 1, whole(syscall.F_WRLCK), false), "lock 1")
	if e := h2.Setlk(bg, 2, whole(syscall.F_WRLCK), false); e != syscall.EAGAIN {
		t.Fatalf("second client's lock: %v", e)
	}
	lk := whole(syscall.F_WRLCK)
	must(t, h2.Getlk(bg, 2, lk), "getlk")
	if lk.Type != syscall.F_WRLCK {
		t.Fatalf("getlk sees %d, want the other client's write lock", lk.Type)
	}
	// A waiting lock is granted when the holder lets go.
	got := make(chan layer.Errno, 1)
	go func() { got <- h2.Setlk(bg, 2, whole(syscall.F_WRLCK), true) }()
	select {
	case e := <-got:
		t.Fatalf("waiting lock returned %v while held", e)
	case <-time.After(200 * time.Millisecond):
	}
	must(t, h1.Flush(bg, 1), "flush (releases owner 1's locks)")
	select {
	case e := <-got:
		must(t, e, "waiting lock")
	case <-time.After(20 * time.Second):
		t.Fatal("waiting lock not granted after the holder's close")
	}
	// A cancelled wait returns EINTR.
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if e := h1.Setlk(ctx, 1, whole(syscall.F_WRLCK), true); e != syscall.EINTR {
		t.Fatalf("cancelled wait: %v", e)
	}
	lk = whole(syscall.F_RDLCK)
	must(t, h1.Getlk(bg, 1, lk), "getlk 1")
	if lk.Type == syscall.F_UNLCK {
		t.Fatal("getlk misses client 2's lock")
	}
	must(t, h2.Setlk(bg, 2, whole(syscall.F_UNLCK), false), "unlock")
	lk = whole(syscall.F_WRLCK)
	must(t, h1.Getlk(bg, 1, lk), "getlk after unlock")
	if lk.Type != syscall.F_UNLCK {
		t.Fatalf("getlk after unlock: %d", lk.Type)
	}
}

// Changes made through the client raise events on its stack.
func TestEvents(t *testing.T) {
	srv := newLocal(t)
	root, st := mount(t, srv)
	var mu sync.Mutex
	var evs []layer.Event
	st.Events().Subscribe(func(ev layer.Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})
	var a layer.Attr
	ctx := layer.WithCaller(bg, layer.Caller{Uid: 0, Gid: 0, View: 7})
	f, h, e := root.Create(ctx, "e", unix.O_RDWR, 0o644, &a)
	must(t, e, "create")
	_, e = h.Write(ctx, []byte("hello"), 3)
	must(t, e, "write")
	h.Release(ctx)
	must(t, f.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 1}, &a), "truncate")
	mu.Lock()
	defer mu.Unlock()
	want := []layer.Event{
		{Kind: layer.Entries, Token: root.Token(), Name: "e", View: 7},
		{Kind: layer.Data, Token: f.Token(), Off: 3, Len: 5, View: 7},
		{Kind: layer.Data, Token: f.Token(), View: 7},
	}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want %+v", evs, want)
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Fatalf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
}

// A 9p:// lower builds through the stack's registry, with its options.
func TestBackend(t *testing.T) {
	srv := newLocal(t)
	os.WriteFile(filepath.Join(srv.dir, "hello"), []byte("hi"), 0o644)
	sp := &stack.Spec{Lower: "9p://" + srv.sock + "?timeout=2s"}
	_, nodes, err := sp.Build(bg)
	if err != nil {
		t.Fatal(err)
	}
	root := nodes[0].(*node)
	defer root.Close()
	if root.fs.timeout != 2*time.Second {
		t.Fatalf("timeout %v", root.fs.timeout)
	}
	lookup(t, root, "hello")
	sp = &stack.Spec{Lower: "9p://" + srv.sock + "?bogus=1"}
	if _, _, err := sp.Build(bg); err == nil {
		t.Fatal("an unknown option was taken")
	}
}
