package crash

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

type kind uint8

const (
	file kind = iota + 1
	dir
	link
)

// A node is what the model expects at a path.
type node struct {
	kind    kind
	data    []byte // a file's contents; replaced, never changed in place
	target  string // a symlink's
	managed bool   // a shard-managed directory (setuid bit)
	synced  bool   // a file fsynced and not changed since
}

func (n node) String() string {
	switch n.kind {
	case file:
		return fmt.Sprintf("file of %d bytes", len(n.data))
	case dir:
		if n.managed {
			return "managed directory"
		}
		return "directory"
	}
	return fmt.Sprintf("symlink to %q", short(n.target))
}

// differs says how got differs from n, or "".
func (n node) differs(got node) string {
	switch {
	case n.kind != got.kind:
		return fmt.Sprintf("is a %v, want a %v", got, n)
	case n.kind == file && !bytes.Equal(n.data, got.data):
		i := 0
		for i < min(len(n.data), len(got.data)) && n.data[i] == got.data[i] {
			i++
		}
		what := "contents"
		if n.synced {
			what = "fsynced contents"
		}
		return fmt.Sprintf("%s differ from byte %d on (%d bytes, want %d)", what, i, len(got.data), len(n.data))
	case n.kind == link && n.target != got.target:
		return fmt.Sprintf("symlink target %q, want %q", short(got.target), short(n.target))
	case n.kind == dir && n.managed != got.managed:
		return fmt.Sprintf("is a %v, want a %v", got, n)
	}
	return ""
}

// A tree maps paths relative to the mount's root (the root itself is not
// in it) to nodes. Trees are values: ops make new ones.
type tree map[string]node

func (tr tree) clone() tree {
	c := make(tree, len(tr))
	for p, n := range tr {
		c[p] = n
	}
	return c
}

// diff lists how got differs from tr.
func (tr tree) diff(got tree) []string {
	var out []string
	for p, w := range tr {
		g, ok := got[p]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: missing, want a %v", short(p), w))
		case w.differs(g) != "":
			out = append(out, fmt.Sprintf("%s: %s", short(p), w.differs(g)))
		}
	}
	for p, g := range got {
		if _, ok := tr[p]; !ok {
			out = append(out, fmt.Sprintf("%s: unexpected %v", short(p), g))
		}
	}
	sort.Strings(out)
	return out
}

// paths returns the sorted paths of nodes of kind k; dir includes the
// root, ".".
func (tr tree) paths(k kind) []string {
	var ps []string
	if k == dir {
		ps = append(ps, ".")
	}
	for p, n := range tr {
		if n.kind == k {
			ps = append(ps, p)
		}
	}
	sort.Strings(ps)
	return ps
}

func (tr tree) empty(d string) bool {
	for p := range tr {
		if path.Dir(p) == d {
			return false
		}
	}
	return true
}

// below reports whether p is d or inside it.
func below(p, d string) bool { return p == d || strings.HasPrefix(p, d+"/") }

func depth(p string) int {
	if p == "." {
		return 0
	}
	return strings.Count(p, "/") + 1
}

// height is how many levels a directory holds below itself.
func (tr tree) height(d string) int {
	h := 0
	for p := range tr {
		if strings.HasPrefix(p, d+"/") {
			h = max(h, depth(p)-depth(d))
		}
	}
	return h
}

// rename moves from, and everything below it, to to, replacing to.
func (tr tree) rename(from, to string) tree {
	next := tr.clone()
	delete(next, to)
	for p, n := range tr {
		if below(p, from) {
			delete(next, p)
			next[to+strings.TrimPrefix(p, from)] = n
		}
	}
	return next
}

// short abbreviates long names in a path for messages.
func short(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if len(s) > 24 {
			parts[i] = fmt.Sprintf("%s…(%d bytes)", s[:12], len(s))
		}
	}
	return strings.Join(parts, "/")
}

// An op is one step of the workload: a system call or two through the
// mount, and the tree it leaves when it completes.
type op struct {
	desc string
	do   func(mnt string) error
	next tree
	// data is set for writes and truncates: the file, its contents
	// before, and the byte range the op rewrites, in whole blocks of the
	// layer (4096), from the old last block if the op extends the file.
	data *dataChange
}

type dataChange struct {
	path   string
	old    []byte
	lo, hi int
}

const (
	blockSize   = 4096 // wrap's block size for rot13 and crypt
	maxFileSize = 384 << 10
	maxEntries  = 60 // the workload removes more than it makes beyond this
	maxDepth    = 4
)

// gen makes random ops valid on the tree they are made for.
type gen struct {
	r       *rand.Rand
	seq     int
	convert bool // shard: chmod u±s converts directories
}

// name returns a new name: short, or of 176 to 255 bytes, which crypt
// stores under a stand-in with a long-name sidecar.
func (g *gen) name() string {
	g.seq++
	if g.r.IntN(2) == 0 {
		return fmt.Sprintf("n%d", g.seq)
	}
	return g.letters(fmt.Sprintf("L%d-", g.seq), 176+g.r.IntN(80))
}

func (g *gen) letters(prefix string, n int) string {
	b := []byte(prefix)
	for len(b) < n {
		b = append(b, "abcdefghijklmnopqrstuvwxyz0123456789_-"[g.r.IntN(38)])
	}
	return string(b)
}

func (g *gen) pick(ps []string) string { return ps[g.r.IntN(len(ps))] }

func join(d, name string) string { return path.Join(d, name) }

// next returns a random op valid on tr.
func (g *gen) next(tr tree) op {
	files, dirs, links := tr.paths(file), tr.paths(dir), tr.paths(link)
	grow := len(tr) < maxEntries
	type choice struct {
		weight int
		make   func() op
	}
	choices := []choice{
		{10, func() op { return g.create(tr, g.pick(dirs)) }},
	}
	if grow {
		choices = append(choices, choice{4, func() op { return g.symlink(tr, g.pick(dirs)) }})
		var shallow []string
		for _, d := range dirs {
			if depth(d) < maxDepth-1 {
				shallow = append(shallow, d)
			}
		}
		if len(shallow) > 0 {
			choices = append(choices, choice{5, func() op { return g.mkdir(tr, g.pick(shallow)) }})
		}
	}
	if len(files) > 0 {
		choices = append(choices,
			choice{30, func() op { return g.write(tr, g.pick(files), false) }},
			choice{8, func() op { return g.write(tr, g.pick(files), true) }},
			choice{5, func() op { return g.truncate(tr, g.pick(files)) }})
	}
	if nondirs := append(files[:len(files):len(files)], links...); len(nondirs) > 0 {
		rm := 6
		if !grow {
			rm = 30
		}
		choices = append(choices,
			choice{rm, func() op { return g.unlink(tr, g.pick(nondirs)) }},
			choice{8, func() op { return g.renameFile(tr, g.pick(nondirs), dirs) }})
	}
	if len(dirs) > 1 {
		sub := dirs[1:]
		choices = append(choices, choice{4, func() op { return g.renameDir(tr, g.pick(sub), dirs) }})
		var empty []string
		for _, d := range sub {
			if tr.empty(d) {
				empty = append(empty, d)
			}
		}
		if len(empty) > 0 {
			choices = append(choices, choice{4, func() op { return g.rmdir(tr, g.pick(empty)) }})
		}
		if g.convert {
			choices = append(choices, choice{4, func() op { return g.chmodSetuid(tr, g.pick(sub)) }})
		}
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	k := g.r.IntN(total)
	for _, c := range choices {
		if k < c.weight {
			return c.make()
		}
		k -= c.weight
	}
	panic("unreachable")
}

func (g *gen) create(tr tree, d string) op {
	p := join(d, g.name())
	next := tr.clone()
	next[p] = node{kind: file}
	return op{desc: "create " + short(p), next: next, do: func(mnt string) error {
		f, err := os.OpenFile(filepath.Join(mnt, p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}}
}

func (g *gen) mkdir(tr tree, d string) op {
	p := join(d, g.name())
	next := tr.clone()
	next[p] = node{kind: dir}
	return op{desc: "mkdir " + short(p), next: next, do: func(mnt string) error {
		return os.Mkdir(filepath.Join(mnt, p), 0o755)
	}}
}

// symlink makes a link with a target of 8 to 60 bytes, or up to 4095
// (crypt stores targets over 3043 bytes, once encrypted and encoded, in a
// sidecar).
func (g *gen) symlink(tr tree, d string) op {
	p := join(d, g.name())
	n := 8 + g.r.IntN(52)
	if g.r.IntN(4) == 0 {
		n = 2000 + g.r.IntN(2096)
	}
	target := g.letters("../t/", n)
	next := tr.clone()
	next[p] = node{kind: link, target: target}
	return op{desc: "symlink " + short(p), next: next, do: func(mnt string) error {
		return os.Symlink(target, filepath.Join(mnt, p))
	}}
}

// write writes at a random offset up to just past the end, mostly a few
// KiB, sometimes up to 128 KiB, and fsyncs if sync is set.
func (g *gen) write(tr tree, p string, sync bool) op {
	old := tr[p].data
	off := g.r.IntN(min(len(old)+2*blockSize, maxFileSize-1))
	n := 1 + g.r.IntN(3*blockSize)
	if g.r.IntN(4) == 0 {
		n = 3*blockSize + g.r.IntN(128<<10)
	}
	n = min(n, maxFileSize-off)
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(g.r.Uint32())
	}
	data := make([]byte, max(len(old), off+n))
	copy(data, old)
	copy(data[off:], buf)
	next := tr.clone()
	next[p] = node{kind: file, data: data, synced: sync}
	desc := fmt.Sprintf("pwrite %s [%d, %d)", short(p), off, off+n)
	if sync {
		desc += " + fsync"
	}
	return op{desc: desc, next: next,
		data: &dataChange{path: p, old: old, lo: min(off, len(old)) / blockSize * blockSize, hi: off + n},
		do: func(mnt string) error {
			f, err := os.OpenFile(filepath.Join(mnt, p), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteAt(buf, int64(off))
			if err == nil && sync {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}}
}

func (g *gen) truncate(tr tree, p string) op {
	old := tr[p].data
	size := g.r.IntN(min(2*len(old)+blockSize, maxFileSize))
	data := make([]byte, size)
	copy(data, old)
	next := tr.clone()
	next[p] = node{kind: file, data: data}
	return op{desc: fmt.Sprintf("truncate %s to %d", short(p), size), next: next,
		data: &dataChange{path: p, old: old, lo: min(size, len(old)) / blockSize * blockSize, hi: max(size, len(old))},
		do: func(mnt string) error {
			return os.Truncate(filepath.Join(mnt, p), int64(size))
		}}
}

func (g *gen) unlink(tr tree, p string) op {
	next := tr.clone()
	delete(next, p)
	return op{desc: "unlink " + short(p), next: next, do: func(mnt string) error {
		return unix.Unlink(filepath.Join(mnt, p))
	}}
}

func (g *gen) rmdir(tr tree, p string) op {
	next := tr.clone()
	delete(next, p)
	return op{desc: "rmdir " + short(p), next: next, do: func(mnt string) error {
		return unix.Rmdir(filepath.Join(mnt, p))
	}}
}

// renameFile moves a file or symlink to a new name in any directory, or
// over another file or symlink.
func (g *gen) renameFile(tr tree, from string, dirs []string) op {
	to := join(g.pick(dirs), g.name())
	if g.r.IntN(3) == 0 {
		var others []string
		for p, n := range tr {
			if n.kind != dir && p != from {
				others = append(others, p)
			}
		}
		if len(others) > 0 {
			sort.Strings(others)
			to = g.pick(others)
		}
	}
	return g.rename(tr, from, to)
}

// renameDir moves a directory into another (not into itself, and not
// deeper than maxDepth), or over an empty one.
func (g *gen) renameDir(tr tree, from string, dirs []string) op {
	var into, over []string
	for _, d := range dirs {
		if below(d, from) {
			continue
		}
		if depth(d)+1+tr.height(from) <= maxDepth {
			into = append(into, d)
		}
		if d != "." && tr.empty(d) && depth(d)+tr.height(from) <= maxDepth {
			over = append(over, d)
		}
	}
	switch {
	case len(over) > 0 && g.r.IntN(3) == 0:
		return g.rename(tr, from, g.pick(over))
	case len(into) > 0:
		return g.rename(tr, from, join(g.pick(into), g.name()))
	}
	return g.rename(tr, from, from) // a rename onto itself does nothing
}

func (g *gen) rename(tr tree, from, to string) op {
	next := tr
	if from != to {
		next = tr.rename(from, to)
	}
	return op{desc: fmt.Sprintf("rename %s to %s", short(from), short(to)), next: next, do: func(mnt string) error {
		return unix.Rename(filepath.Join(mnt, from), filepath.Join(mnt, to))
	}}
}

// chmodSetuid converts a directory to a managed one or back (shard).
func (g *gen) chmodSetuid(tr tree, p string) op {
	n := tr[p]
	n.managed = !n.managed
	next := tr.clone()
	next[p] = n
	mode := uint32(0o755)
	if n.managed {
		mode |= unix.S_ISUID
	}
	return op{desc: fmt.Sprintf("chmod %o %s", mode, short(p)), next: next, do: func(mnt string) error {
		return unix.Chmod(filepath.Join(mnt, p), mode)
	}}
}
