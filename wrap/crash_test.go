package wrap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// crasher stops a lower layer at a mutating call, as a kill -9 of the
// serving process would: that call and every later one do nothing.
type crasher struct {
	left    int // mutating calls still done; negative: all
	stopped bool
}

func (c *crasher) alive() bool {
	if c.stopped || c.left == 0 {
		c.stopped = true
		return false
	}
	c.left--
	return true
}

// dead is what a call to a stopped lower layer returns; nothing above it
// is looked at after the crash.
const dead = syscall.ENOTCONN

// crashNode is a lower node whose mutating calls count down a crasher.
type crashNode struct {
	layer.Node
	c *crasher
}

type crashHandle struct {
	layer.Handle
	c *crasher
}

func (n *crashNode) node(x layer.Node) layer.Node { return &crashNode{x, n.c} }

func under(x layer.Node) layer.Node {
	if c, ok := x.(*crashNode); ok {
		return c.Node
	}
	return x
}

func underHandle(h layer.Handle) layer.Handle {
	if c, ok := h.(*crashHandle); ok {
		return c.Handle
	}
	return h
}

func (n *crashNode) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	c, e := n.Node.Lookup(ctx, name, out)
	if e != 0 {
		return nil, e
	}
	return n.node(c), 0
}

func (n *crashNode) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	return n.Node.Getattr(ctx, underHandle(h), out)
}

func (n *crashNode) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if !n.c.alive() {
		return dead
	}
	return n.Node.Setattr(ctx, underHandle(h), in, out)
}

// made wraps the node a mutating call made.
func (n *crashNode) made(mk func() (layer.Node, layer.Errno)) (layer.Node, layer.Errno) {
	if !n.c.alive() {
		return nil, dead
	}
	c, e := mk()
	if e != 0 {
		return nil, e
	}
	return n.node(c), 0
}

func (n *crashNode) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.made(func() (layer.Node, layer.Errno) { return n.Node.Mkdir(ctx, name, mode, out) })
}

func (n *crashNode) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.made(func() (layer.Node, layer.Errno) { return n.Node.Symlink(ctx, target, name, out) })
}

func (n *crashNode) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.made(func() (layer.Node, layer.Errno) { return n.Node.Link(ctx, under(target), name, out) })
}

func (n *crashNode) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	var h layer.Handle
	c, e := n.made(func() (layer.Node, layer.Errno) {
		c, lh, e := n.Node.Create(ctx, name, flags, mode, out)
		h = lh
		return c, e
	})
	if e != 0 {
		return nil, nil, e
	}
	return c, &crashHandle{h, n.c}, 0
}

func (n *crashNode) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	h, e := n.Node.Open(ctx, flags)
	if e != 0 {
		return nil, e
	}
	return &crashHandle{h, n.c}, 0
}

func (n *crashNode) Unlink(ctx context.Context, name string) layer.Errno {
	if !n.c.alive() {
		return dead
	}
	return n.Node.Unlink(ctx, name)
}

func (n *crashNode) Rmdir(ctx context.Context, name string) layer.Errno {
	if !n.c.alive() {
		return dead
	}
	return n.Node.Rmdir(ctx, name)
}

func (n *crashNode) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	if !n.c.alive() {
		return dead
	}
	return n.Node.Rename(ctx, name, under(newDir), newName, flags)
}

func (h *crashHandle) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	if !h.c.alive() {
		return 0, dead
	}
	return h.Handle.Write(ctx, data, off)
}

// layerOver stacks the toy layer over lower directory dir, through a
// crasher if c is not nil.
func layerOver(t *testing.T, dir string, c *crasher) (layer.Node, error) {
	t.Helper()
	st := stack.New(stack.Options{})
	lower, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lower.Forget)
	giveRootID(t, dir)
	if c != nil {
		lower = &crashNode{lower, c}
	}
	return New(ctx, st, lower, toyHooks)
}

// crashRun runs op through a layer over dir whose lower layer stops at
// its k-th mutating call (from 0; negative: never), and tells whether it
// stopped: whether op was cut short.
func crashRun(t *testing.T, dir string, k int, op func(root layer.Node)) bool {
	t.Helper()
	c := &crasher{left: k}
	root, err := layerOver(t, dir, c)
	if err == nil {
		// It fails to undo what it began, and says so.
		root.(*node).fs.log = slog.New(slog.DiscardHandler)
		op(root)
	} else if !c.stopped {
		t.Fatal(err)
	}
	return c.stopped
}

// fresh is the layer over dir after a crash: a new instance, as at the
// next mount.
func fresh(t *testing.T, dir string) layer.Node {
	t.Helper()
	root, err := layerOver(t, dir, nil)
	if err != nil {
		t.Fatalf("the layer after the crash: %v", err)
	}
	return root
}

// obj is what a walk found at a path: a directory, or a file's contents,
// or a symlink's target.
type obj struct {
	mode uint32
	data string
}

// walk lists every directory through the layer, reads every file and
// every symlink, and reports what fails.
func walk(t *testing.T, root layer.Node) map[string]obj {
	t.Helper()
	tree := map[string]obj{}
	var visit func(d layer.Node, p string)
	visit = func(d layer.Node, p string) {
		for _, name := range listNames(t, d, p) {
			q := path.Join(p, name)
			var a layer.Attr
			c, e := d.Lookup(ctx, name, &a)
			if e != 0 {
				t.Errorf("lookup %s: %v", q, e)
				continue
			}
			o := obj{mode: a.Mode & syscall.S_IFMT}
			switch o.mode {
			case syscall.S_IFDIR:
				visit(c, q)
			case syscall.S_IFREG:
				o.data = readAll(t, c, q, a.Size)
			case syscall.S_IFLNK:
				target, e := c.Readlink(ctx)
				if e != 0 {
					t.Errorf("readlink %s: %v", q, e)
				}
				o.data = string(target)
			}
			tree[q] = o
			c.Forget()
		}
	}
	visit(root, ".")
	return tree
}

func listNames(t *testing.T, d layer.Node, p string) []string {
	t.Helper()
	s, e := d.OpenDir(ctx)
	if e != 0 {
		t.Errorf("list %s: %v", p, e)
		return nil
	}
	defer s.Close()
	var names []string
	for {
		ent, ok, e := s.Next(ctx)
		if e != 0 {
			t.Errorf("list %s: %v", p, e)
		}
		if e != 0 || !ok {
			return names
		}
		if ent.Name != "." && ent.Name != ".." {
			names = append(names, ent.Name)
		}
	}
}

func readAll(t *testing.T, n layer.Node, p string, size uint64) string {
	t.Helper()
	h, e := n.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		t.Errorf("open %s: %v", p, e)
		return ""
	}
	defer h.Release(ctx)
	b := make([]byte, size+1)
	k, e := h.Read(ctx, b, 0)
	if e != 0 {
		t.Errorf("read %s: %v", p, e)
	}
	return string(b[:k])
}

// lowerProblems checks lower directory dir as test/crash does for crypt:
// every directory has its identity, every stand-in its sidecar, holding
// the encoded name its hash names, every sidecar its stand-in, and
// nothing else of the layer's is there.
func lowerProblems(dir string) []string {
	var probs []string
	filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
		rel, _ := filepath.Rel(dir, p)
		if err != nil {
			probs = append(probs, fmt.Sprintf("%s: %v", rel, err))
			return nil
		}
		name := de.Name()
		switch {
		case p == dir, name == ".id":
		case strings.HasPrefix(name, longPrefix) && strings.HasSuffix(name, sidecarSuffix):
			enc, err := os.ReadFile(p)
			sum := sha256.Sum256(enc)
			if _, serr := os.Lstat(strings.TrimSuffix(p, sidecarSuffix)); serr != nil {
				probs = append(probs, rel+": orphan sidecar")
			} else if err != nil || longPrefix+base64.RawURLEncoding.EncodeToString(sum[:])+sidecarSuffix != name {
				probs = append(probs, fmt.Sprintf("%s: holds %q, not its stand-in's name", rel, enc))
			}
		case strings.HasPrefix(name, longPrefix):
			if _, err := os.Lstat(p + sidecarSuffix); err != nil {
				probs = append(probs, rel+": stand-in without its sidecar")
			}
		case strings.HasPrefix(name, "."):
			probs = append(probs, rel+": left over")
			if de.IsDir() {
				return filepath.SkipDir
			}
		}
		if de.IsDir() {
			if id, err := os.ReadFile(filepath.Join(p, ".id")); err != nil || len(id) == 0 {
				probs = append(probs, fmt.Sprintf("%s: identity %q, %v", rel, id, err))
			}
		}
		return nil
	})
	return probs
}

// useAll checks that every directory of tree takes new entries, then
// removes everything through the layer, which must leave the root's
// identity alone below.
func useAll(t *testing.T, dir string, root layer.Node, tree map[string]obj) {
	t.Helper()
	dirs := []string{"."}
	var all []string
	for p, o := range tree {
		all = append(all, p)
		if o.mode == syscall.S_IFDIR {
			dirs = append(dirs, p)
		}
	}
	var a layer.Attr
	for _, p := range dirs {
		d := lookupPath(t, root, p)
		if c, h, e := d.Create(ctx, "probe", syscall.O_RDWR|syscall.O_EXCL, 0o644, &a); e != 0 {
			t.Errorf("create in %s: %v", p, e)
		} else {
			h.Release(ctx)
			c.Forget()
			if e := d.Unlink(ctx, "probe"); e != 0 {
				t.Errorf("unlink in %s: %v", p, e)
			}
		}
		if c, e := d.Mkdir(ctx, "probe", 0o755, &a); e != 0 {
			t.Errorf("mkdir in %s: %v", p, e)
		} else {
			c.Forget()
			if e := d.Rmdir(ctx, "probe"); e != 0 {
				t.Errorf("rmdir in %s: %v", p, e)
			}
		}
	}
	// The deepest first.
	slices.SortFunc(all, func(p, q string) int { return strings.Count(q, "/") - strings.Count(p, "/") })
	for _, p := range all {
		d, rm := lookupPath(t, root, path.Dir(p)), layer.Node.Unlink
		if tree[p].mode == syscall.S_IFDIR {
			rm = layer.Node.Rmdir
		}
		if e := rm(d, ctx, path.Base(p)); e != 0 {
			t.Errorf("remove %s: %v", p, e)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 || ents[0].Name() != ".id" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("after removing everything, the lower root holds %q", names)
	}
}

func lookupPath(t *testing.T, root layer.Node, p string) layer.Node {
	t.Helper()
	n := root
	for _, name := range strings.Split(p, "/") {
		if name == "." {
			continue
		}
		var a layer.Attr
		c, e := n.Lookup(ctx, name, &a)
		if e != 0 {
			t.Fatalf("lookup %s: %v", p, e)
		}
		t.Cleanup(c.Forget)
		n = c
	}
	return n
}

// Names the toy layer stores under stand-ins with sidecars.
var (
	long1 = strings.Repeat("L", 130)
	long2 = strings.Repeat("M", 130)
)

func mustOK(t *testing.T, what string, e layer.Errno) {
	t.Helper()
	if e != 0 {
		t.Fatalf("%s: %v", what, e)
	}
}

func mkfile(t *testing.T, d layer.Node, name, data string) {
	t.Helper()
	var a layer.Attr
	c, h, e := d.Create(ctx, name, syscall.O_RDWR|syscall.O_EXCL, 0o644, &a)
	mustOK(t, "create "+name, e)
	if _, e := h.Write(ctx, []byte(data), 0); e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	c.Forget()
}

func mkdir(t *testing.T, d layer.Node, name string) layer.Node {
	t.Helper()
	var a layer.Attr
	c, e := d.Mkdir(ctx, name, 0o755, &a)
	mustOK(t, "mkdir "+name, e)
	return c
}

// A crash between any two lower calls of a namespace operation leaves a
// tree that reads whole, as before the operation or after it, with the
// layer's own files consistent below once listed, every directory
// taking new entries and everything removable.
func TestCrashPoints(t *testing.T) {
	var a layer.Attr
	ops := []struct {
		name string
		op   func(d layer.Node) // in directory d, through the layer that crashes
	}{
		{"mkdir", func(d layer.Node) { d.Mkdir(ctx, "new", 0o755, &a) }},
		{"mkdir long", func(d layer.Node) { d.Mkdir(ctx, long1, 0o755, &a) }},
		{"create long", func(d layer.Node) { d.Create(ctx, long1, syscall.O_RDWR|syscall.O_EXCL, 0o644, &a) }},
		{"create existing long", func(d layer.Node) { d.Create(ctx, long2, syscall.O_RDWR|syscall.O_TRUNC, 0o644, &a) }},
		{"symlink long", func(d layer.Node) { d.Symlink(ctx, []byte("target"), long1, &a) }},
		{"link long", func(d layer.Node) {
			if c, e := d.Lookup(ctx, "a", &a); e == 0 {
				d.Link(ctx, c, long1, &a)
			}
		}},
		{"unlink long", func(d layer.Node) { d.Unlink(ctx, long2) }},
		{"rename to long", func(d layer.Node) { d.Rename(ctx, "a", d, long1, 0) }},
		{"rename onto long", func(d layer.Node) { d.Rename(ctx, "a", d, long2, 0) }},
		{"rename from long", func(d layer.Node) { d.Rename(ctx, long2, d, "b", 0) }},
		{"rmdir", func(d layer.Node) { d.Rmdir(ctx, "e") }},
		{"rmdir long", func(d layer.Node) { d.Rmdir(ctx, long1+"d") }},
		{"rename directory onto empty one", func(d layer.Node) { d.Rename(ctx, "f", d, "e", 0) }},
	}
	setup := func(t *testing.T, dir string) {
		root, err := layerOver(t, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := mkdir(t, root, "d")
		defer d.Forget()
		mkfile(t, d, "a", "hello")
		mkfile(t, d, long2, "long")
		mkdir(t, d, "e").Forget()
		mkdir(t, d, long1+"d").Forget()
		f := mkdir(t, d, "f")
		mkfile(t, f, "in f", "x")
		f.Forget()
	}
	run := func(t *testing.T, dir string, k int, op func(layer.Node)) bool {
		return crashRun(t, dir, k, func(root layer.Node) {
			if d, e := root.Lookup(ctx, "d", &a); e == 0 {
				op(d)
				d.Forget()
			}
		})
	}
	for _, tc := range ops {
		t.Run(tc.name, func(t *testing.T) {
			before, after := t.TempDir(), t.TempDir()
			setup(t, before)
			setup(t, after)
			if run(t, after, -1, tc.op) {
				t.Fatal("stopped without a crash point")
			}
			treeBefore, treeAfter := walk(t, fresh(t, before)), walk(t, fresh(t, after))
			if equalTrees(treeBefore, treeAfter) {
				t.Fatal("the operation changed nothing")
			}
			for k := 0; ; k++ {
				dir := t.TempDir()
				setup(t, dir)
				if !run(t, dir, k, tc.op) {
					if k == 0 {
						t.Fatal("no lower call")
					}
					break
				}
				root := fresh(t, dir)
				tree := walk(t, root)
				if !equalTrees(tree, treeBefore) && !equalTrees(tree, treeAfter) {
					t.Errorf("crash at lower call %d: the tree is neither the one before nor the one after:\n%v\nbefore %v\nafter %v", k, tree, treeBefore, treeAfter)
				}
				for _, p := range lowerProblems(dir) {
					t.Errorf("crash at lower call %d: below, once listed: %s", k, p)
				}
				useAll(t, dir, root, tree)
				if t.Failed() {
					t.FailNow()
				}
			}
		})
	}
}

func equalTrees(a, b map[string]obj) bool {
	if len(a) != len(b) {
		return false
	}
	for p, o := range a {
		if q, ok := b[p]; !ok || q != o {
			return false
		}
	}
	return true
}

// The first use of a lower root writes its identity; a crash meanwhile
// leaves a root the next use takes.
func TestCrashFirstUse(t *testing.T) {
	for k := 0; ; k++ {
		dir := t.TempDir()
		if !crashRun(t, dir, k, func(layer.Node) {}) {
			break
		}
		root := fresh(t, dir)
		useAll(t, dir, root, walk(t, root))
		if t.Failed() {
			t.Fatalf("crash at lower call %d", k)
		}
	}
}

// What crashes of earlier versions left, or a kill between an rmdir's
// two lower calls, is taken as it is met: a sidecar without its stand-in
// and a temporary of a gone instance are removed by a listing, and by
// rmdir, which they do not keep from being empty; an empty directory
// without a sound identity gets one; a directory with entries but no
// sound identity fails with EIO and says so in the log.
func TestLeftoversMet(t *testing.T) {
	sidecar := longPrefix + "orphan" + sidecarSuffix
	stale := tmpPrefix + "gone.1"
	cases := []struct {
		name   string
		damage func(t *testing.T, d string) // the lower directory of "d"
		list   bool                         // list d before the checks
		broken bool                         // d holds an entry but no identity
	}{
		{"orphan sidecar", func(t *testing.T, d string) { write(t, filepath.Join(d, sidecar), "x") }, true, false},
		{"orphan sidecar, no listing", func(t *testing.T, d string) { write(t, filepath.Join(d, sidecar), "x") }, false, false},
		{"stale temporary file", func(t *testing.T, d string) { write(t, filepath.Join(d, stale), "") }, true, false},
		{"stale temporary directory, no listing", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, stale), 0o755)
			write(t, filepath.Join(d, stale, ".id"), "\x01")
		}, false, false},
		{"missing identity", func(t *testing.T, d string) { os.Remove(filepath.Join(d, ".id")) }, false, false},
		{"missing identity, listed", func(t *testing.T, d string) { os.Remove(filepath.Join(d, ".id")) }, true, false},
		{"empty identity", func(t *testing.T, d string) { write(t, filepath.Join(d, ".id"), "") }, false, false},
		{"empty identity, listed", func(t *testing.T, d string) { write(t, filepath.Join(d, ".id"), "") }, true, false},
		{"missing identity with an entry", func(t *testing.T, d string) {
			os.Remove(filepath.Join(d, ".id"))
			write(t, filepath.Join(d, "nxx61"), "")
		}, false, true},
		{"empty identity with an entry", func(t *testing.T, d string) {
			write(t, filepath.Join(d, ".id"), "")
			write(t, filepath.Join(d, "nxx61"), "")
		}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			root, err := layerOver(t, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			mkdir(t, root, "d").Forget()
			lowerD := filepath.Join(dir, "nxx64") // "d" in the root, whose identity is 2 bytes
			tc.damage(t, lowerD)
			root = fresh(t, dir)
			var logged bytes.Buffer
			root.(*node).fs.log = slog.New(slog.NewTextHandler(&logged, nil))
			var a layer.Attr
			d, e := root.Lookup(ctx, "d", &a)
			mustOK(t, "lookup d", e)
			defer d.Forget()
			if tc.broken {
				if _, e := d.OpenDir(ctx); e != syscall.EIO {
					t.Errorf("listing: %v, want EIO", e)
				}
				if _, e := d.Lookup(ctx, "a", &a); e != syscall.EIO {
					t.Errorf("lookup: %v, want EIO", e)
				}
				if _, _, e := d.Create(ctx, "b", syscall.O_RDWR, 0o644, &a); e != syscall.EIO {
					t.Errorf("create: %v, want EIO", e)
				}
				if e := root.Rmdir(ctx, "d"); e != syscall.ENOTEMPTY {
					t.Errorf("rmdir: %v, want ENOTEMPTY", e)
				}
				if !strings.Contains(logged.String(), "identity file is missing or damaged, and it holds entries") {
					t.Errorf("log: %q", logged.String())
				}
				return
			}
			if tc.list {
				if names := listNames(t, d, "d"); len(names) != 0 {
					t.Errorf("listing: %q", names)
				}
				if p := lowerProblems(dir); len(p) != 0 {
					t.Errorf("below, once listed: %q", p)
				}
			}
			// Without a listing first, rmdir meets the leftovers.
			useAll(t, dir, root, map[string]obj{"d": {mode: syscall.S_IFDIR}})
			if logged.Len() != 0 {
				t.Errorf("log: %q", logged.String())
			}
		})
	}
}

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The sidecar of a long name being made is no orphan yet: listings and
// rmdir leave it meanwhile; once the name is made or given up, it is one.
func TestSidecarBeingMade(t *testing.T) {
	dir, root := newLayer(t, toyHooks)
	d := mkdir(t, root, "d").(*node)
	defer d.Forget()
	lname, e := d.encodeName(ctx, long1)
	mustOK(t, "encode", e)
	done := d.makingLong(lname)
	mustOK(t, "sidecar", d.writeSidecar(ctx, lname, long1))
	side := filepath.Join(dir, "nxx64", lname+sidecarSuffix)
	listNames(t, d, "d")
	if _, err := os.Stat(side); err != nil {
		t.Errorf("a listing removed the sidecar of a name being made: %v", err)
	}
	if e := root.Rmdir(ctx, "d"); e != syscall.ENOTEMPTY {
		t.Errorf("rmdir while a name is being made in it: %v, want ENOTEMPTY", e)
	}
	done()
	if e := root.Rmdir(ctx, "d"); e != 0 {
		t.Errorf("rmdir once it is given up: %v", e)
	}
}
