package shard

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

var ctx = context.Background()

// newShard stacks shard over hostfs on a temporary directory, whose root
// is managed if managed is set.
func newShard(t *testing.T, managed bool) (string, layer.Node) {
	t.Helper()
	dir := t.TempDir()
	if managed {
		if err := os.Chmod(dir, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	}
	return dir, shardOver(t, hostfsOn(t, dir))
}

// testStack is the stack of every layer the tests build.
var testStack = stack.New(stack.Options{})

// hostfsOn opens directory dir as a hostfs layer.
func hostfsOn(t *testing.T, dir string) layer.Node {
	t.Helper()
	lower, err := hostfs.New(testStack, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lower.Forget)
	return lower
}

// shardOver stacks a new shard layer over lower; over a tree shard has
// used it reads the tree as after a restart.
func shardOver(t *testing.T, lower layer.Node) layer.Node {
	t.Helper()
	root, err := New(ctx, testStack, lower)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func must(t *testing.T, e layer.Errno, what string) {
	t.Helper()
	if e != 0 {
		t.Fatalf("%s: %v", what, e)
	}
}

func lookup(t *testing.T, d layer.Node, name string) layer.Node {
	t.Helper()
	var a layer.Attr
	c, e := d.Lookup(ctx, name, &a)
	must(t, e, "lookup "+name)
	t.Cleanup(c.Forget)
	return c
}

func create(t *testing.T, d layer.Node, name string) {
	t.Helper()
	var a layer.Attr
	c, h, e := d.Create(ctx, name, syscall.O_WRONLY|syscall.O_EXCL, 0o644, &a)
	must(t, e, "create "+name)
	h.Release(ctx)
	c.Forget()
}

// list reads a whole directory, without "." and "..", sorted, and fails
// on duplicates.
func list(t *testing.T, d layer.Node) []string {
	t.Helper()
	s, e := d.OpenDir(ctx)
	must(t, e, "opendir")
	defer s.Close()
	var names []string
	dots := 0
	for {
		ent, ok, e := s.Next(ctx)
		must(t, e, "readdir")
		if !ok {
			break
		}
		if ent.Name == "." || ent.Name == ".." {
			dots++
			continue
		}
		names = append(names, ent.Name)
	}
	if dots != 2 {
		t.Errorf("listing has %d dot entries, want 2", dots)
	}
	slices.Sort(names)
	if c := slices.Compact(slices.Clone(names)); len(c) != len(names) {
		t.Errorf("listing has duplicates: %v", names)
	}
	return names
}

func setMode(t *testing.T, d layer.Node, mode uint32) layer.Errno {
	t.Helper()
	var a layer.Attr
	return d.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: mode}, &a)
}

// checkLayout verifies the lower side of managed directory dir: only
// buckets at the top, every entry in the bucket its name hashes to.
func checkLayout(t *testing.T, dir string) int {
	t.Helper()
	top, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range top {
		b, ok := bucketIndex(e.Name())
		if !ok || !e.IsDir() {
			t.Errorf("%s: %s beside the buckets", dir, e.Name())
			continue
		}
		ents, err := os.ReadDir(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range ents {
			if pb, _ := place(c.Name()); pb != b {
				t.Errorf("%s in bucket %x, belongs in %x", c.Name(), b, pb)
			}
			n++
		}
	}
	return n
}

func TestBucketNames(t *testing.T) {
	for b := range nBuckets {
		if i, ok := bucketIndex(bucketName(b)); !ok || i != b {
			t.Fatalf("bucketIndex(%q) = %d, %v", bucketName(b), i, ok)
		}
	}
	for _, s := range []string{".shard-400", ".shard-fff", ".shard-0A0", ".shard-00", "shard-000", ".shard-0000"} {
		if _, ok := bucketIndex(s); ok {
			t.Errorf("%q taken for a bucket", s)
		}
	}
}

// Marking converts, unmarking converts back, and no entry is lost or
// changed either way; the mark shows in the mode, nlink counts
// subdirectories, and data and links survive.
func TestConvertBothWays(t *testing.T) {
	dir, root := newShard(t, false)
	var want []string
	for i := range 500 {
		name := "f" + string(rune('a'+i%26)) + string(rune('0'+i%10)) + string(rune('a'+i/26%26))
		if i%50 == 0 {
			var a layer.Attr
			c, e := root.Mkdir(ctx, name, 0o755, &a)
			must(t, e, "mkdir")
			c.Forget()
		} else {
			create(t, root, name)
		}
		want = append(want, name)
	}
	var a layer.Attr
	s, e := root.Symlink(ctx, []byte("target"), "link", &a)
	must(t, e, "symlink")
	s.Forget()
	want = append(want, "link")
	slices.Sort(want)

	must(t, setMode(t, root, 0o4755), "chmod u+s")
	if got := list(t, root); !slices.Equal(got, want) {
		t.Fatalf("after marking: %d entries, want %d", len(got), len(want))
	}
	if n := checkLayout(t, dir); n != len(want) {
		t.Errorf("%d entries in buckets, want %d", n, len(want))
	}
	must(t, root.Getattr(ctx, nil, &a), "getattr")
	if a.Mode&syscall.S_ISUID == 0 || a.Nlink != 2+10 {
		t.Errorf("managed dir: mode %o nlink %d, want setuid and 12", a.Mode, a.Nlink)
	}
	if tg, e := lookup(t, root, "link").Readlink(ctx); e != 0 || string(tg) != "target" {
		t.Errorf("symlink target %q, %v", tg, e)
	}

	must(t, setMode(t, root, 0o755), "chmod u-s")
	if got := list(t, root); !slices.Equal(got, want) {
		t.Fatalf("after unmarking: %d entries, want %d", len(got), len(want))
	}
	top, _ := os.ReadDir(dir)
	if len(top) != len(want) {
		t.Errorf("lower holds %d entries after unmarking, want %d", len(top), len(want))
	}
	st, _ := os.Stat(dir)
	if st.Mode()&os.ModeSetuid != 0 {
		t.Error("mark still set below")
	}
}

// A directory whose conversion was cut short (the bit set, entries still
// at the top) reads whole, and its next use finishes the conversion.
func TestHalfConvertedReadsWhole(t *testing.T) {
	dir, root := newShard(t, false)
	for _, n := range []string{"a", "b", "c"} {
		create(t, root, n)
	}
	// What a crash right after the chmod leaves, plus one entry moved.
	must(t, setMode(t, root, 0o4755), "chmod u+s")
	b, _ := place("a")
	if err := os.Rename(filepath.Join(dir, bucketName(b), "a"), filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	root2 := shardOver(t, hostfsOn(t, dir))
	if got := list(t, root2); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("half-converted listing %v", got)
	}
	lookup(t, root2, "a")
	if n := checkLayout(t, dir); n != 3 {
		t.Errorf("%d entries in buckets after use, want 3", n)
	}
}

// A name that would read as a bucket keeps a directory from being marked.
func TestReservedNameRefusesMarking(t *testing.T) {
	_, root := newShard(t, false)
	create(t, root, bucketName(5))
	if e := setMode(t, root, 0o4755); e != syscall.EINVAL {
		t.Fatalf("marking = %v, want EINVAL", e)
	}
	// In a managed directory such a name is an ordinary entry.
	_, m := newShard(t, true)
	create(t, m, bucketName(5))
	if got := list(t, m); !slices.Equal(got, []string{bucketName(5)}) {
		t.Fatalf("listing %v", got)
	}
}

// An empty managed directory can be removed, and replaced by rename,
// though its buckets remain beneath.
func TestRemoveEmptyManaged(t *testing.T) {
	_, root := newShard(t, false)
	var a layer.Attr
	for _, name := range []string{"m", "m2", "d"} {
		c, e := root.Mkdir(ctx, name, 0o755, &a)
		must(t, e, "mkdir")
		c.Forget()
	}
	m := lookup(t, root, "m")
	must(t, setMode(t, m, 0o4755), "chmod u+s")
	create(t, m, "x")
	if e := root.Rmdir(ctx, "m"); e != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a non-empty managed dir = %v", e)
	}
	must(t, m.Unlink(ctx, "x"), "unlink")
	must(t, root.Rmdir(ctx, "m"), "rmdir of an empty managed dir")

	m2 := lookup(t, root, "m2")
	must(t, setMode(t, m2, 0o4755), "chmod u+s")
	create(t, m2, "y")
	must(t, m2.Unlink(ctx, "y"), "unlink")
	must(t, root.Rename(ctx, "d", root, "m2", 0), "rename over an empty managed dir")
	if got := list(t, root); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("listing %v", got)
	}
}

// longNameCall is one of the layer's calls that name an entry.
type longNameCall struct {
	what string
	call func(d, f layer.Node, name string) layer.Errno
}

// longNameCalls: d is the directory, f its entry "f", name the name to
// try; calls that make a node forget it.
var longNameCalls = func() []longNameCall {
	var a layer.Attr
	made := func(c layer.Node, e layer.Errno) layer.Errno {
		if c != nil {
			c.Forget()
		}
		return e
	}
	return []longNameCall{
		{"lookup", func(d, f layer.Node, name string) layer.Errno { return made(d.Lookup(ctx, name, &a)) }},
		{"unlink", func(d, f layer.Node, name string) layer.Errno { return d.Unlink(ctx, name) }},
		{"rmdir", func(d, f layer.Node, name string) layer.Errno { return d.Rmdir(ctx, name) }},
		{"rename from", func(d, f layer.Node, name string) layer.Errno { return d.Rename(ctx, name, d, "g", 0) }},
		{"rename to", func(d, f layer.Node, name string) layer.Errno { return d.Rename(ctx, "f", d, name, 0) }},
		{"create", func(d, f layer.Node, name string) layer.Errno {
			c, h, e := d.Create(ctx, name, syscall.O_WRONLY|syscall.O_EXCL, 0o644, &a)
			if h != nil {
				h.Release(ctx)
			}
			return made(c, e)
		}},
		{"mkdir", func(d, f layer.Node, name string) layer.Errno { return made(d.Mkdir(ctx, name, 0o755, &a)) }},
		{"mknod", func(d, f layer.Node, name string) layer.Errno {
			return made(d.Mknod(ctx, name, syscall.S_IFIFO|0o644, 0, &a))
		}},
		{"symlink", func(d, f layer.Node, name string) layer.Errno { return made(d.Symlink(ctx, []byte("t"), name, &a)) }},
		{"link", func(d, f layer.Node, name string) layer.Errno { return made(d.Link(ctx, f, name, &a)) }},
	}
}()

// A name longer than NAME_MAX fails with ENAMETOOLONG in a managed
// directory as in a host directory, though no bucket holds it, and
// leaves no bucket behind.
func TestLongNames(t *testing.T) {
	dir, root := newShard(t, true)
	create(t, root, "f")
	f := lookup(t, root, "f")
	host := hostfsOn(t, t.TempDir())
	create(t, host, "f")
	hf := lookup(t, host, "f")
	long := strings.Repeat("n", 256)
	for _, c := range longNameCalls {
		want := c.call(host, hf, long)
		if want != syscall.ENAMETOOLONG {
			t.Fatalf("%s on the host: %v, want ENAMETOOLONG", c.what, want)
		}
		if e := c.call(root, f, long); e != want {
			t.Errorf("%s: %v, want %v", c.what, e, want)
		}
	}
	b, _ := place(long)
	if _, err := os.Lstat(filepath.Join(dir, bucketName(b))); !os.IsNotExist(err) {
		t.Errorf("the long name's bucket was made: %v", err)
	}
}

// clearsMarkOnChown is a lower directory that clears the setuid and
// setgid bits when its owner or group changes, as POSIX allows chown to
// do to any file (older XFS did, for callers without CAP_FSETID).
type clearsMarkOnChown struct{ layer.Node }

func (c clearsMarkOnChown) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if e := c.Node.Setattr(ctx, h, in, out); e != 0 || in.Valid&(layer.SetUid|layer.SetGid) == 0 {
		return e
	}
	return c.Node.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetMode, Mode: out.Mode & 0o777}, out)
}

// A change of owner or group that clears the mark beneath leaves the
// directory managed, beneath too, so that its entries are still read
// from their buckets after a restart; only a mode without the bit
// unmarks.
func TestChownKeepsMark(t *testing.T) {
	marked := func(t *testing.T, dir string, root layer.Node, want []string) {
		t.Helper()
		var a layer.Attr
		must(t, root.Getattr(ctx, nil, &a), "getattr")
		if a.Mode&syscall.S_ISUID == 0 {
			t.Errorf("mode %o above, want the mark", a.Mode)
		}
		if st, err := os.Stat(dir); err != nil || st.Mode()&os.ModeSetuid == 0 {
			t.Errorf("mark gone beneath: %v, %v", st.Mode(), err)
		}
		if got := list(t, shardOver(t, hostfsOn(t, dir))); !slices.Equal(got, want) {
			t.Errorf("after a restart: %v, want %v", got, want)
		}
		checkLayout(t, dir)
	}
	names := []string{"a", "b", "c"}
	for _, tc := range []struct {
		what    string
		managed bool
		in      layer.SetAttr
	}{
		{"chgrp", true, layer.SetAttr{Valid: layer.SetGid, Gid: 100}},
		{"chown", true, layer.SetAttr{Valid: layer.SetUid | layer.SetGid, Uid: 65534, Gid: 65534}},
		{"chmod and chown", true, layer.SetAttr{Valid: layer.SetMode | layer.SetUid, Mode: 0o4775, Uid: 65534}},
		{"mark and chown", false, layer.SetAttr{Valid: layer.SetMode | layer.SetGid, Mode: 0o4755, Gid: 100}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			dir := t.TempDir()
			if tc.managed {
				if err := os.Chmod(dir, 0o755|os.ModeSetuid); err != nil {
					t.Fatal(err)
				}
			}
			root := shardOver(t, clearsMarkOnChown{hostfsOn(t, dir)})
			for _, n := range names {
				create(t, root, n)
			}
			var a layer.Attr
			must(t, root.Setattr(ctx, nil, &tc.in, &a), tc.what)
			if a.Mode&syscall.S_ISUID == 0 {
				t.Errorf("%s answered mode %o, want the mark", tc.what, a.Mode)
			}
			marked(t, dir, root, names)
			// chmod u-s still unmarks (through a plain lower: the
			// wrapper would not do as a rename target for hostfs).
			must(t, setMode(t, shardOver(t, hostfsOn(t, dir)), 0o755), "chmod u-s")
			if top, _ := os.ReadDir(dir); len(top) != len(names) {
				t.Errorf("after chmod u-s the lower holds %d entries, want %d", len(top), len(names))
			}
		})
	}
}

// A bucket a crash left as mkdir made it (0700, the process's) gets its
// directory's owner, group and mode when shard next uses it.
func TestBucketAttrsRepaired(t *testing.T) {
	dir, root := newShard(t, true)
	var a layer.Attr
	_, h, e := root.Create(ctx, "f", syscall.O_WRONLY, 0o644, &a)
	must(t, e, "create")
	h.Release(ctx)
	if err := syscall.Chmod(dir, 0o4775); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 100); err != nil {
		t.Fatal(err)
	}
	b, _ := place("f")
	bucket := filepath.Join(dir, bucketName(b))
	if err := os.Chmod(bucket, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(bucket, 0, 0); err != nil {
		t.Fatal(err)
	}
	// A stat first (it counts subdirectories in the buckets), then a
	// listing, as ls -la does.
	fresh := shardOver(t, hostfsOn(t, dir))
	must(t, fresh.Getattr(ctx, nil, &a), "getattr")
	must(t, readAll(ctx, fresh, func(layer.DirEntry) {}), "list")
	var st syscall.Stat_t
	if err := syscall.Stat(bucket, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o775 || st.Uid != 65534 || st.Gid != 100 {
		t.Errorf("bucket: mode %o uid %d gid %d, want 775 65534 100", st.Mode&0o7777, st.Uid, st.Gid)
	}
}
