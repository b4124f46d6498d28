package hostfs

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

func newFS(t *testing.T) (string, layer.Node) {
	t.Helper()
	dir := t.TempDir()
	root, err := New(stack.New(stack.Options{}), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(root.Forget)
	return dir, root
}

var ctx = context.Background()

func lookup(t *testing.T, n layer.Node, name string) layer.Node {
	t.Helper()
	var a layer.Attr
	c, e := n.Lookup(ctx, name, &a)
	if e != 0 {
		t.Fatalf("Lookup(%q): %v", name, e)
	}
	t.Cleanup(c.Forget)
	return c
}

func TestNamesThatWouldEscapeAreRefused(t *testing.T) {
	_, root := newFS(t)
	var a layer.Attr
	for _, name := range []string{"", ".", "..", "a/b", "../etc", "x\x00y"} {
		if _, e := root.Lookup(ctx, name, &a); e != syscall.EINVAL {
			t.Errorf("Lookup(%q) = %v, want EINVAL", name, e)
		}
		if _, e := root.Mkdir(ctx, name, 0o755, &a); e != syscall.EINVAL {
			t.Errorf("Mkdir(%q) = %v, want EINVAL", name, e)
		}
		if e := root.Rename(ctx, "x", root, name, 0); e != syscall.EINVAL {
			t.Errorf("Rename to %q = %v, want EINVAL", name, e)
		}
	}
}

// A symlink that points outside is never followed, whatever is asked of it.
func TestSymlinksAreNotFollowed(t *testing.T) {
	dir, root := newFS(t)
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	link := lookup(t, root, "link")
	dirlink := lookup(t, root, "dirlink")
	var a layer.Attr
	if e := link.Getattr(ctx, nil, &a); e != 0 || a.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Fatalf("Getattr of a symlink: %v mode %o, want the link itself", e, a.Mode)
	}
	if h, e := link.Open(ctx, syscall.O_RDWR); e == 0 {
		h.Release(ctx)
		t.Error("Open of a symlink to outside succeeded")
	}
	link.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o777}, &a)
	link.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetSize}, &a)
	link.Setxattr(ctx, "user.x", []byte("1"), 0)
	if _, e := dirlink.Lookup(ctx, "outside", &a); e != syscall.ENOTDIR {
		t.Errorf("Lookup through a symlink to a directory = %v, want ENOTDIR", e)
	}
	if _, e := dirlink.Mkdir(ctx, "new", 0o755, &a); e != syscall.ENOTDIR {
		t.Errorf("Mkdir through a symlink to a directory = %v, want ENOTDIR", e)
	}
	st, err := os.Stat(outside)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "secret" || st.Mode().Perm() != 0o644 {
		t.Errorf("file outside changed: %q %v", b, st.Mode())
	}
	if _, err := unix.Getxattr(outside, "user.x", nil); err != unix.ENODATA {
		t.Errorf("xattr appeared outside: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "new")); err == nil {
		t.Error("directory created outside")
	}
}

// A node holds its inode, not a path: renaming its parent does not change
// what it refers to, and a name swapped in later is not picked up.
func TestNodesFollowRenames(t *testing.T) {
	dir, root := newFS(t)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "f"), []byte("one"), 0o644)
	d := lookup(t, root, "d")
	f := lookup(t, d, "f")
	if e := root.Rename(ctx, "d", root, "e", 0); e != 0 {
		t.Fatal(e)
	}
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "f"), []byte("two"), 0o644)
	h, e := f.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		t.Fatal(e)
	}
	defer h.Release(ctx)
	buf := make([]byte, 10)
	k, _ := h.Read(ctx, buf, 0)
	if string(buf[:k]) != "one" {
		t.Errorf("node read %q after rename, want the original file's %q", buf[:k], "one")
	}
	var a layer.Attr
	g, gh, e := d.Create(ctx, "g", syscall.O_WRONLY, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	gh.Release(ctx)
	g.Forget()
	if _, err := os.Stat(filepath.Join(dir, "e", "g")); err != nil {
		t.Errorf("Create through the renamed directory's node: %v", err)
	}
}

func TestTokens(t *testing.T) {
	dir, root := newFS(t)
	os.WriteFile(filepath.Join(dir, "a"), nil, 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	a, b := lookup(t, root, "a"), lookup(t, root, "b")
	if a.Token() != b.Token() {
		t.Errorf("hard links have tokens %v and %v, want one", a.Token(), b.Token())
	}
	if e := root.Unlink(ctx, "a"); e != 0 {
		t.Fatal(e)
	}
	if e := root.Unlink(ctx, "b"); e != 0 {
		t.Fatal(e)
	}
	var at layer.Attr
	c, h, e := root.Create(ctx, "a", syscall.O_WRONLY, 0o644, &at)
	if e != 0 {
		t.Fatal(e)
	}
	defer c.Forget()
	h.Release(ctx)
	if c.Token() == a.Token() {
		t.Errorf("a new file has the token %v of a deleted one", c.Token())
	}
}

func TestDirOffsetsResume(t *testing.T) {
	dir, root := newFS(t)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	names := func(off uint64) []string {
		d, e := root.OpenDir(ctx)
		if e != 0 {
			t.Fatal(e)
		}
		defer d.Close()
		if e := d.Seek(ctx, off); e != 0 {
			t.Fatal(e)
		}
		var out []string
		for {
			ent, ok, e := d.Next(ctx)
			if e != 0 {
				t.Fatal(e)
			}
			if !ok {
				return out
			}
			out = append(out, ent.Name)
		}
	}
	all := names(0)
	if len(all) != 7 {
		t.Fatalf("listing %v, want . .. and 5 names", all)
	}
	d, _ := root.OpenDir(ctx)
	defer d.Close()
	d.Next(ctx)
	third, _, _ := d.Next(ctx)
	third, _, _ = d.Next(ctx)
	rest := names(third.Off)
	if len(rest) != 4 || rest[0] != all[3] {
		t.Errorf("resuming after %q gives %v, want %v", third.Name, rest, all[3:])
	}
}

// Create over a fifo of that name refuses at once: opening it would wait
// for a writer for ever.
func TestCreateOverFifo(t *testing.T) {
	dir, root := newFS(t)
	if err := unix.Mkfifo(filepath.Join(dir, "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	var a layer.Attr
	if _, _, e := root.Create(ctx, "p", syscall.O_RDONLY, 0o644, &a); e != syscall.EEXIST {
		t.Fatalf("create over a fifo: %v, want EEXIST", e)
	}
	// A regular file is opened as asked: blocking, unless asked not to.
	c, h, e := root.Create(ctx, "f", syscall.O_RDWR, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer c.Forget()
	defer h.Release(ctx)
	fd, ok := h.(layer.Passthrougher).PassthroughFd()
	if !ok {
		t.Fatal("no descriptor")
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Fatalf("flags %#x (%v): O_NONBLOCK left on", fl, err)
	}
}

// Objects made for another user belong to that user, with the group the
// lower file system chooses (a setgid directory's).
func TestCreateAsCaller(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: run the suite as root")
	}
	dir, root := newFS(t)
	os.Chmod(dir, 0o777)
	sg := filepath.Join(dir, "sg")
	os.Mkdir(sg, 0o777)
	os.Chown(sg, 0, 100)
	unix.Chmod(sg, 0o2777)
	user := layer.WithCaller(ctx, layer.Caller{Uid: 65534, Gid: 65534, Pid: uint32(os.Getpid())})
	var a layer.Attr
	c, h, e := root.Create(user, "mine", syscall.O_WRONLY, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	c.Forget()
	if a.Uid != 65534 || a.Gid != 65534 {
		t.Errorf("file made for 65534:65534 is %d:%d", a.Uid, a.Gid)
	}
	sgn := lookup(t, root, "sg")
	d, e := sgn.Mkdir(user, "sub", 0o755, &a)
	if e != 0 {
		t.Fatal(e)
	}
	d.Forget()
	if a.Uid != 65534 || a.Gid != 100 || a.Mode&syscall.S_ISGID == 0 {
		t.Errorf("dir made in a setgid dir is %d:%d mode %o, want 65534:100 with setgid", a.Uid, a.Gid, a.Mode)
	}
	// The thread went back to root: what root makes is root's.
	c, h, e = root.Create(ctx, "roots", syscall.O_WRONLY, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	c.Forget()
	if a.Uid != 0 {
		t.Errorf("file made by root afterwards belongs to %d", a.Uid)
	}
}

// More nodes than descriptors: the cache trades descriptors for handles
// and every node stays usable.
func TestDescriptorBudget(t *testing.T) {
	dir, root := newFS(t)
	fs := root.(*node).fs
	fs.fds.budget = 8
	var nodes []layer.Node
	for i := 0; i < 100; i++ {
		name := fmt.Sprintf("f%03d", i)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, lookup(t, root, name))
	}
	if k := len(fs.fds.ring); k > 8 {
		t.Errorf("%d descriptors held, budget 8", k)
	}
	for i, n := range nodes {
		name := fmt.Sprintf("f%03d", i)
		h, e := n.Open(ctx, syscall.O_RDONLY)
		if e != 0 {
			t.Fatalf("Open %s: %v", name, e)
		}
		buf := make([]byte, 8)
		k, _ := h.Read(ctx, buf, 0)
		h.Release(ctx)
		if string(buf[:k]) != name {
			t.Fatalf("node %s reads %q", name, buf[:k])
		}
		var a layer.Attr
		if e := n.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o600}, &a); e != 0 || a.Mode&0o777 != 0o600 {
			t.Fatalf("Setattr %s: %v %o", name, e, a.Mode)
		}
	}
	if k := len(fs.fds.ring); k > 8 {
		t.Errorf("%d descriptors held after use, budget 8", k)
	}
}

// A process's POSIX lock taken through a second open file survives the
// release of the first, whose descriptor it had closed (FLUSH) before.
func TestReleaseKeepsLaterLocks(t *testing.T) {
	_, root := newFS(t)
	var a layer.Attr
	f, h0, e := root.Create(ctx, "f", syscall.O_RDWR, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer f.Forget()
	h0.Release(ctx)
	const p, q = 1, 2
	wr := func() *layer.Lock { return &layer.Lock{End: math.MaxInt64, Type: syscall.F_WRLCK} }
	h1, _ := f.Open(ctx, syscall.O_RDWR)
	if e := h1.Setlk(ctx, p, wr(), false); e != 0 {
		t.Fatal(e)
	}
	h1.Flush(ctx, p) // p closes its descriptor; a child keeps h1 open
	h2, _ := f.Open(ctx, syscall.O_RDWR)
	defer h2.Release(ctx)
	if e := h2.Setlk(ctx, p, wr(), false); e != 0 {
		t.Fatal(e)
	}
	h1.Release(ctx) // the child's last close
	if e := h2.Setlk(ctx, q, wr(), false); e != syscall.EAGAIN {
		t.Fatalf("another owner's lock while p holds one: %v, want EAGAIN", e)
	}
}

// Without file handles (not root), nodes keep their descriptors.
func TestNoHandlesNoEviction(t *testing.T) {
	dir, root := newFS(t)
	fs := root.(*node).fs
	fs.fds.budget, fs.fds.handles = 4, false
	var nodes []layer.Node
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("f%d", i)
		os.WriteFile(filepath.Join(dir, name), nil, 0o644)
		nodes = append(nodes, lookup(t, root, name))
	}
	var a layer.Attr
	for _, n := range nodes {
		if e := n.Getattr(ctx, nil, &a); e != 0 {
			t.Fatalf("Getattr: %v", e)
		}
	}
}
