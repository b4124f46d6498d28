package remote

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

func TestFiles(t *testing.T) {
	servers(t, func(t *testing.T, mk func(t *testing.T) server) {
		srv := mk(t)
		root, _ := mount(t, srv)
		var a layer.Attr
		must(t, root.Getattr(bg, nil, &a), "getattr root")
		if !a.IsDir() {
			t.Fatalf("root mode %o", a.Mode)
		}

		d, e := root.Mkdir(bg, "d", 0o755, &a)
		must(t, e, "mkdir")
		if !a.IsDir() {
			t.Fatalf("mkdir made mode %o", a.Mode)
		}
		f, h, e := d.Create(bg, "f", unix.O_RDWR, 0o644, &a)
		must(t, e, "create")
		if f.Token().Ino != a.Ino || f.Token().Gen == 0 {
			t.Fatalf("token %+v for ino %d", f.Token(), a.Ino)
		}

		// 4 MiB: many messages each way.
		data := make([]byte, 4<<20)
		rand.Read(data)
		k, e := h.Write(bg, data, 0)
		must(t, e, "write")
		if k != len(data) {
			t.Fatalf("wrote %d of %d", k, len(data))
		}
		must(t, h.Fsync(bg, false), "fsync")
		got := make([]byte, len(data)+100)
		k, e = h.Read(bg, got, 0)
		must(t, e, "read")
		if k != len(data) || !bytes.Equal(got[:k], data) {
			t.Fatalf("read %d bytes, not what was written", k)
		}
		must(t, h.Release(bg), "release")

		// Through a fresh lookup and open, and on the server's disk.
		f2 := lookup(t, d, "f")
		if f2.Token() != f.Token() {
			t.Fatalf("lookup token %+v, create token %+v", f2.Token(), f.Token())
		}
		h2, e := f2.Open(bg, unix.O_RDONLY)
		must(t, e, "open")
		k, e = h2.Read(bg, got[:10], 4<<20-5)
		must(t, e, "read tail")
		if k != 5 || !bytes.Equal(got[:5], data[len(data)-5:]) {
			t.Fatalf("tail read %d", k)
		}
		h2.Release(bg)
		disk, err := os.ReadFile(filepath.Join(serverDir(srv), "d", "f"))
		if err != nil || !bytes.Equal(disk, data) {
			t.Fatalf("server file differs: %v", err)
		}

		// Setattr: truncate and chmod.
		var sa layer.Attr
		_, local := srv.(*localServer)
		in := &layer.SetAttr{Valid: layer.SetSize | layer.SetMode, Size: 10, Mode: 0o600}
		if local {
			in.Valid = layer.SetSize // localfs cannot chmod
		}
		must(t, f2.Setattr(bg, nil, in, &sa), "setattr")
		if sa.Size != 10 || (!local && sa.Mode&0o7777 != 0o600) {
			t.Fatalf("setattr gave size %d mode %o", sa.Size, sa.Mode)
		}

		// Rename moves the node: it still works by its new path, also
		// for a uid that has no fid for it yet.
		must(t, d.Rename(bg, "f", root, "g", 0), "rename")
		if _, e := d.Lookup(bg, "f", &a); e != syscall.ENOENT {
			t.Fatalf("old name: %v", e)
		}
		must(t, f2.Getattr(bg, nil, &a), "getattr after rename")
		if e := d.Rename(bg, "x", root, "y", unix.RENAME_EXCHANGE); e != syscall.EINVAL {
			t.Fatalf("rename with RENAME_EXCHANGE: %v", e)
		}
		// RENAME_NOREPLACE: refused over an existing name, done otherwise.
		nr, e := root.Mkdir(bg, "nr", 0o755, &a)
		must(t, e, "mkdir nr")
		nr.Forget()
		if e := root.Rename(bg, "g", root, "nr", unix.RENAME_NOREPLACE); e != syscall.EEXIST {
			t.Fatalf("rename over a name with RENAME_NOREPLACE: %v", e)
		}
		must(t, root.Rename(bg, "g", root, "g2", unix.RENAME_NOREPLACE), "rename to a new name with RENAME_NOREPLACE")
		must(t, root.Rename(bg, "g2", root, "g", 0), "rename back")

		// Symlink, readlink, link.
		_, e = root.Symlink(bg, []byte("g"), "s", &a)
		must(t, e, "symlink")
		if a.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			t.Fatalf("symlink mode %o", a.Mode)
		}
		target, e := lookup(t, root, "s").Readlink(bg)
		must(t, e, "readlink")
		if string(target) != "g" {
			t.Fatalf("readlink %q", target)
		}
		g := lookup(t, root, "g")
		l, e := d.Link(bg, g, "hard", &a)
		if e == 0 {
			if l.Token().Ino != g.Token().Ino || a.Nlink != 2 {
				t.Fatalf("link: token %+v vs %+v, nlink %d", l.Token(), g.Token(), a.Nlink)
			}
		} else if !local {
			t.Fatalf("link: %v", e)
		}

		if local {
			if e := root.Unlink(bg, "s"); e != syscall.ENOSYS {
				t.Fatalf("localfs unlinked: %v", e) // then test it
			}
			return // localfs has no unlink; nor statfs
		}

		// Unlink and rmdir.
		must(t, root.Unlink(bg, "s"), "unlink")
		if e := root.Rmdir(bg, "d"); e != syscall.ENOTEMPTY && e != syscall.EEXIST {
			t.Fatalf("rmdir of a full directory: %v", e)
		}
		if e == 0 {
			must(t, d.Unlink(bg, "hard"), "unlink hard")
		}
		must(t, root.Rmdir(bg, "d"), "rmdir")

		var sf layer.Statfs
		must(t, root.Statfs(bg, &sf), "statfs")
		if sf.Bsize == 0 || sf.Blocks == 0 {
			t.Fatalf("statfs %+v", sf)
		}
	})
}

func serverDir(s server) string {
	switch s := s.(type) {
	case *localServer:
		return s.dir
	case *diodServer:
		return s.dir
	}
	panic("unknown server")
}

func TestReaddir(t *testing.T) {
	servers(t, func(t *testing.T, mk func(t *testing.T) server) {
		srv := mk(t)
		root, _ := mount(t, srv)
		var a layer.Attr
		d, e := root.Mkdir(bg, "many", 0o755, &a)
		must(t, e, "mkdir")
		want := map[string]bool{}
		for i := range 1000 {
			name := fmt.Sprintf("entry-with-a-longish-name-%04d", i)
			want[name] = true
			os.WriteFile(filepath.Join(serverDir(srv), "many", name), nil, 0o644)
		}
		ds, e := d.OpenDir(bg)
		must(t, e, "opendir")
		defer ds.Close()
		all := drain(t, ds)
		if len(all) != 1000 {
			t.Fatalf("listed %d entries", len(all))
		}
		for _, ent := range all {
			if !want[ent.Name] {
				t.Fatalf("entry %+v", ent)
			}
		}
		if _, ok := srv.(*localServer); ok {
			return // localfs gives no types and ignores offsets
		}
		for _, ent := range all {
			if ent.Type != syscall.S_IFREG {
				t.Fatalf("entry %+v", ent)
			}
		}
		// Seek to the offset of entry 500: the listing resumes after it.
		must(t, ds.Seek(bg, all[500].Off), "seek")
		var rest []string
		for {
			ent, ok, e := ds.Next(bg)
			must(t, e, "next after seek")
			if !ok {
				break
			}
			rest = append(rest, ent.Name)
		}
		var wantRest []string
		for _, ent := range all[501:] {
			wantRest = append(wantRest, ent.Name)
		}
		sort.Strings(rest)
		sort.Strings(wantRest)
		if fmt.Sprint(rest) != fmt.Sprint(wantRest) {
			t.Fatalf("after seek: %d entries, want %d", len(rest), len(wantRest))
		}
	})
}
