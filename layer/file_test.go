package layer_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// dir is a host directory through hostfs that counts the nodes it hands
// out and has not had forgotten, and can fail as some backends do.
type dir struct {
	layer.Node
	live     *atomic.Int64
	noLink   bool        // Link is unsupported (EPERM, as link(2) says)
	fsyncErr layer.Errno // what handles' Fsync returns
}

type counted struct {
	layer.Node
	live *atomic.Int64
}

func (c counted) Forget() {
	c.live.Add(-1)
	c.Node.Forget()
}

type failingHandle struct {
	layer.Handle
	fsyncErr layer.Errno
}

func (h failingHandle) Fsync(context.Context, bool) layer.Errno { return h.fsyncErr }

func (d *dir) count(n layer.Node, e layer.Errno) (layer.Node, layer.Errno) {
	if e != 0 {
		return nil, e
	}
	d.live.Add(1)
	return counted{n, d.live}, 0
}

func (d *dir) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return d.count(d.Node.Lookup(ctx, name, out))
}

func (d *dir) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	n, h, e := d.Node.Create(ctx, name, flags, mode, out)
	if e == 0 && d.fsyncErr != 0 {
		h = failingHandle{h, d.fsyncErr}
	}
	n, e = d.count(n, e)
	return n, h, e
}

func (d *dir) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	if d.noLink {
		return nil, syscall.EPERM
	}
	return d.count(d.Node.Link(ctx, target.(counted).Node, name, out))
}

func (d *dir) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	return d.Node.Rename(ctx, name, newDir.(*dir).Node, newName, flags)
}

func newDir(t *testing.T) (*dir, string) {
	t.Helper()
	path := t.TempDir()
	root, err := hostfs.New(stack.New(stack.Options{}), path)
	if err != nil {
		t.Fatal(err)
	}
	d := &dir{Node: root, live: new(atomic.Int64)}
	t.Cleanup(func() {
		if n := d.live.Load(); n != 0 {
			t.Errorf("%d nodes not forgotten", n)
		}
		root.Forget()
	})
	return d, path
}

func wantNames(t *testing.T, d layer.Node, want ...string) {
	t.Helper()
	names, err := layer.ReadDirNames(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, want) {
		t.Errorf("directory holds %q, want %q", names, want)
	}
}

func wantContent(t *testing.T, d layer.Node, name string, want []byte) {
	t.Helper()
	got, err := layer.ReadFile(context.Background(), d, name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s holds %d bytes %.20q, want %d bytes %.20q", name, len(got), got, len(want), want)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	ctx := context.Background()
	for _, noLink := range []bool{false, true} {
		d, path := newDir(t)
		d.noLink = noLink
		if err := layer.WriteFileAtomic(ctx, d, "conf", []byte("one"), 0o600, false); err != nil {
			t.Fatal(err)
		}
		wantContent(t, d, "conf", []byte("one"))
		if st, err := os.Stat(filepath.Join(path, "conf")); err != nil || st.Mode() != 0o600 {
			t.Errorf("conf: %v, mode %v, want 0600", err, st.Mode())
		}
		err := layer.WriteFileAtomic(ctx, d, "conf", []byte("two"), 0o600, false)
		var pe *fs.PathError
		if !errors.Is(err, fs.ErrExist) || !errors.As(err, &pe) || pe.Path != "conf" {
			t.Errorf("no-replace write over a file (no link: %v): %v, want EEXIST naming conf", noLink, err)
		}
		wantContent(t, d, "conf", []byte("one"))
		if err := layer.WriteFileAtomic(ctx, d, "conf", []byte("three"), 0o600, true); err != nil {
			t.Fatal(err)
		}
		wantContent(t, d, "conf", []byte("three"))
		wantNames(t, d, "conf") // no temporary left
	}
}

func TestWriteFileAtomicFailure(t *testing.T) {
	ctx := context.Background()
	d, _ := newDir(t)
	if err := layer.WriteFileAtomic(ctx, d, "conf", []byte("old"), 0o600, false); err != nil {
		t.Fatal(err)
	}
	d.fsyncErr = syscall.EIO
	for _, replace := range []bool{false, true} {
		if err := layer.WriteFileAtomic(ctx, d, "conf", []byte("new"), 0o600, replace); !errors.Is(err, syscall.EIO) {
			t.Errorf("write with a failing fsync (replace: %v): %v, want EIO", replace, err)
		}
	}
	wantContent(t, d, "conf", []byte("old"))
	wantNames(t, d, "conf")
}

// A file larger than one read and than ReadFile's size hint reads whole.
func TestReadFileLarge(t *testing.T) {
	d, path := newDir(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16+1)
	if err := os.WriteFile(filepath.Join(path, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	wantContent(t, d, "big", data)
	if err := os.WriteFile(filepath.Join(path, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantContent(t, d, "empty", nil)
}

func TestReadErrors(t *testing.T) {
	ctx := context.Background()
	d, path := newDir(t)
	if _, err := layer.ReadFile(ctx, d, "none"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: %v, want not exist", err)
	}
	os.Mkdir(filepath.Join(path, "sub"), 0o755)
	if _, err := layer.ReadFile(ctx, d, "sub"); err == nil {
		t.Error("ReadFile of a directory succeeded")
	}
	f, _ := os.Create(filepath.Join(path, "f"))
	f.Close()
	var a layer.Attr
	n, e := d.Lookup(ctx, "f", &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	if _, err := layer.ReadDirNames(ctx, n); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("ReadDirNames of a file: %v, want ENOTDIR", err)
	}
	wantNames(t, d, "f", "sub")
}
