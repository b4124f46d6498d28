package shard

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/shalefs/shale/layer"
)

// model is the flat view users should see: each directory's entries, by
// path ("" is the root).
type model map[string]map[string]bool // dir -> name -> isDir

// TestRandomOps runs random namespace operations on a shard layer over
// hostfs, in a managed root, a managed subdirectory and an ordinary one,
// with the odd conversion either way, and checks every result and listing
// against a map, and the lower layout of managed directories.
func TestRandomOps(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomOps(t, seed, 1500) })
	}
}

func randomOps(t *testing.T, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 1))
	dir, root := newShard(t, true)
	var a layer.Attr
	for _, d := range []string{"m", "u"} {
		c, e := root.Mkdir(ctx, d, 0o755, &a)
		must(t, e, "mkdir")
		c.Forget()
	}
	nodes := map[string]layer.Node{"": root, "m": lookup(t, root, "m"), "u": lookup(t, root, "u")}
	must(t, setMode(t, nodes["m"], 0o4755), "mark m")
	managed := map[string]bool{"": true, "m": true, "u": false}
	m := model{"": {"m": true, "u": true}, "m": {}, "u": {}}
	dirs := []string{"", "m", "u"}
	name := func() string { return fmt.Sprintf("n%d", r.IntN(40)) }
	errno := func(ok bool, e layer.Errno) layer.Errno {
		if ok {
			return 0
		}
		return e
	}
	for step := range steps {
		d := dirs[r.IntN(len(dirs))]
		n, nm := nodes[d], name()
		isDir, exists := m[d][nm]
		var got, want layer.Errno
		var what string
		switch op := r.IntN(100); {
		case op < 25:
			what = "create " + nm
			var c layer.Node
			var h layer.Handle
			c, h, got = n.Create(ctx, nm, syscall.O_WRONLY|syscall.O_EXCL, 0o644, &a)
			if got == 0 {
				h.Release(ctx)
				c.Forget()
			}
			want = errno(!exists, syscall.EEXIST)
			if want == 0 {
				m[d][nm] = false
			}
		case op < 35:
			what = "mkdir " + nm
			var c layer.Node
			c, got = n.Mkdir(ctx, nm, 0o755, &a)
			if got == 0 {
				c.Forget()
			}
			want = errno(!exists, syscall.EEXIST)
			if want == 0 {
				m[d][nm] = true
			}
		case op < 50:
			what = "unlink " + nm
			got = n.Unlink(ctx, nm)
			switch {
			case !exists:
				want = syscall.ENOENT
			case isDir:
				want = syscall.EISDIR
			default:
				delete(m[d], nm)
			}
		case op < 58:
			what = "rmdir " + nm
			got = n.Rmdir(ctx, nm)
			switch {
			case !exists:
				want = syscall.ENOENT
			case !isDir:
				want = syscall.ENOTDIR
			default:
				delete(m[d], nm)
			}
		case op < 80:
			// Within, into and out of managed directories.
			d2 := dirs[r.IntN(len(dirs))]
			nm2 := name()
			what = fmt.Sprintf("rename %s/%s %s/%s", d, nm, d2, nm2)
			if nm == "m" || nm == "u" || nm2 == "m" || nm2 == "u" {
				continue // keep the test's directories
			}
			got = n.Rename(ctx, nm, nodes[d2], nm2, 0)
			isDir2, exists2 := m[d2][nm2]
			switch {
			case !exists:
				want = syscall.ENOENT
			case d == d2 && nm == nm2:
			case exists2 && isDir && !isDir2:
				want = syscall.ENOTDIR
			case exists2 && !isDir && isDir2:
				want = syscall.EISDIR
			default:
				// Directories moved are empty: rmdir and mkdir
				// keep the model flat per test directory.
				delete(m[d], nm)
				m[d2][nm2] = isDir
			}
		case op < 95:
			what = "lookup " + nm
			var c layer.Node
			c, got = n.Lookup(ctx, nm, &a)
			if got == 0 {
				c.Forget()
				if a.IsDir() != isDir {
					t.Fatalf("step %d: %s: dir=%v, want %v", step, what, a.IsDir(), isDir)
				}
			}
			want = errno(exists, syscall.ENOENT)
		default:
			// Convert m back and forth now and then.
			mark := !managed["m"]
			what = fmt.Sprintf("chmod m (mark=%v)", mark)
			mode := uint32(0o755)
			if mark {
				mode |= syscall.S_ISUID
			}
			got = setMode(t, nodes["m"], mode)
			managed["m"] = mark
		}
		if got != want {
			t.Fatalf("step %d: %s: got %v, want %v", step, what, got, want)
		}
		if step%100 == 99 {
			checkAll(t, dir, nodes, m, managed)
		}
	}
	checkAll(t, dir, nodes, m, managed)
}

// checkAll compares every listing and the lower layout with the model.
func checkAll(t *testing.T, dir string, nodes map[string]layer.Node, m model, managed map[string]bool) {
	t.Helper()
	for d, ents := range m {
		var want []string
		subdirs := uint32(0)
		for nm, isDir := range ents {
			want = append(want, nm)
			if isDir {
				subdirs++
			}
		}
		var a layer.Attr
		must(t, nodes[d].Getattr(ctx, nil, &a), "getattr")
		if a.Nlink != 2+subdirs {
			t.Fatalf("%q: nlink %d, want %d", d, a.Nlink, 2+subdirs)
		}
		slices.Sort(want)
		if got := list(t, nodes[d]); !slices.Equal(got, want) {
			t.Fatalf("%q lists %v, want %v", d, got, want)
		}
	}
	for d, ok := range managed {
		if !ok {
			continue
		}
		lower := dir
		if d != "" {
			b, _ := place(d)
			lower = filepath.Join(dir, bucketName(b), d)
		}
		if n := checkLayout(t, lower); n != len(m[d]) {
			t.Fatalf("%q: %d entries in buckets, want %d", d, n, len(m[d]))
		}
	}
}
