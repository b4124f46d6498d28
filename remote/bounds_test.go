package remote

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// exported is shale's own server (export over hostfs) in this process,
// which the client reaches over pipes.
type exported struct {
	dir string
	s   *export.Server
}

func newExported(t *testing.T, opts export.Options) *exported {
	t.Helper()
	x := &exported{dir: t.TempDir()}
	st := stack.New(stack.Options{})
	host, err := hostfs.New(st, x.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Forget)
	opts.NoRootSquash = true
	x.s = export.New(st, map[string]layer.Node{"": host}, opts)
	return x
}

func (x *exported) dial(ctx context.Context) (net.Conn, error) {
	cli, srv := net.Pipe()
	go x.s.ServeConn(srv)
	return cli, nil
}

func mountWith(t *testing.T, dial func(context.Context) (net.Conn, error), opts Options) *node {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	root, err := newFS(bg, stack.New(stack.Options{}), dial, "", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

// A tree of more files than the server lets a connection hold fids: the
// client keeps few idle node fids, so every file can be looked up and
// stated again, and open handles keep theirs.
func TestIdleFids(t *testing.T) {
	const files, maxFids, idle = 500, 64, 16
	x := newExported(t, export.Options{MaxFids: maxFids})
	for i := range files {
		if err := os.WriteFile(filepath.Join(x.dir, fmt.Sprintf("f%03d", i)), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := mountWith(t, x.dial, Options{idleFids: idle})
	nodes := make([]layer.Node, files)
	var handles []layer.Handle
	for i := range nodes {
		nodes[i] = lookup(t, root, fmt.Sprintf("f%03d", i))
		if i%50 == 0 {
			h, e := nodes[i].Open(bg, unix.O_RDONLY)
			must(t, e, "open f%03d", i)
			handles = append(handles, h)
		}
	}
	var a layer.Attr
	for i, n := range nodes {
		must(t, n.Getattr(bg, nil, &a), "stat f%03d again", i)
		if a.Ino != n.Token().Ino {
			t.Fatalf("f%03d: stat gives ino %d, token %d", i, a.Ino, n.Token().Ino)
		}
	}
	c, e := root.fs.conn(bg)
	must(t, e, "conn")
	if k := c.idleFids(); k > idle {
		t.Fatalf("%d idle node fids kept, want at most %d", k, idle)
	}
	buf := make([]byte, 10)
	for i, h := range handles {
		k, e := h.Read(bg, buf, 0)
		must(t, e, "read through handle %d", i)
		if string(buf[:k]) != "data" {
			t.Fatalf("handle %d read %q", i, buf[:k])
		}
		must(t, h.Release(bg), "release")
	}
}
