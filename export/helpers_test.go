package export

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// counts are the nodes, handles and directory streams a counting layer
// has given out and not had back, and the errors of giving one back twice.
type counts struct {
	nodes, handles, dirs, twice atomic.Int64
	view                        atomic.Uint32 // Caller.View of the last write
	overflow                    atomic.Int64  // reads and writes whose end overflows
	hang                        chan struct{} // what a Lookup of hangName waits for
	hanging                     atomic.Int64  // Lookups of hangName waiting for it
	// dirFail, if not 0: the next stream to have returned that many
	// entries fails its next Next once, with EIO.
	dirFail atomic.Int64
}

func (c *counts) check(t *testing.T) {
	t.Helper()
	if n, h, d, tw := c.nodes.Load(), c.handles.Load(), c.dirs.Load(), c.twice.Load(); n != 0 || h != 0 || d != 0 || tw != 0 {
		t.Errorf("left behind: %d nodes, %d handles, %d dir streams; %d given back twice", n, h, d, tw)
	}
}

// cnode is a counting layer over another node: it checks that the export
// Forgets every node it is given exactly once, and releases every handle.
type cnode struct {
	layer.PassThrough
	c      *counts
	root   bool
	forgot atomic.Bool
}

var _ layer.Node = (*cnode)(nil)

func (c *counts) wrap(n layer.Node) *cnode {
	c.nodes.Add(1)
	return &cnode{PassThrough: layer.PassThrough{Lower: n}, c: c}
}

func (n *cnode) Forget() {
	if n.root {
		n.c.twice.Add(1) // the server must never forget a root
		return
	}
	if !n.forgot.CompareAndSwap(false, true) {
		n.c.twice.Add(1)
		return
	}
	n.c.nodes.Add(-1)
	n.Lower.Forget()
}

func (n *cnode) child(c layer.Node, e layer.Errno) (layer.Node, layer.Errno) {
	if e != 0 {
		return nil, e
	}
	return n.c.wrap(c), 0
}

// blockName is a name whose Lookup waits until its request is cancelled
// (a lower layer that hangs), then fails with EINTR.
const blockName = "block-until-cancelled"

// hangName is a name whose Lookup waits for counts.hang to close,
// cancelled or not (a lower layer that ignores cancellation).
const hangName = "hang-until-released"

// slowName is a name whose Lookup waits for counts.hang to close, then
// finds the file.
const slowName = "slow-until-released"

func (n *cnode) Lookup(ctx context.Context, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	switch name {
	case slowName:
		<-n.c.hang
	case blockName:
		<-ctx.Done()
		return nil, syscall.EINTR
	case hangName:
		n.c.hanging.Add(1)
		<-n.c.hang
		return nil, syscall.ENOENT
	}
	return n.child(n.Lower.Lookup(ctx, name, out))
}

func (n *cnode) Mkdir(ctx context.Context, name string, mode uint32, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.child(n.Lower.Mkdir(ctx, name, mode, out))
}

func (n *cnode) Mknod(ctx context.Context, name string, mode uint32, dev uint64, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.child(n.Lower.Mknod(ctx, name, mode, dev, out))
}

func (n *cnode) Symlink(ctx context.Context, target []byte, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	return n.child(n.Lower.Symlink(ctx, target, name, out))
}

func (n *cnode) Link(ctx context.Context, target layer.Node, name string, out *layer.Attr) (layer.Node, layer.Errno) {
	n.c.used(target)
	return n.child(n.Lower.Link(ctx, target.(*cnode).Lower, name, out))
}

// used counts a use of n after its Forget as a node given back twice.
func (c *counts) used(n layer.Node) {
	if n.(*cnode).forgot.Load() {
		c.twice.Add(1)
	}
}

func (n *cnode) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	c, h, e := n.Lower.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return nil, nil, e
	}
	n.c.handles.Add(1)
	return n.c.wrap(c), &chandle{Handle: h, c: n.c}, 0
}

func (n *cnode) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	n.c.used(newDir)
	return n.Lower.Rename(ctx, name, newDir.(*cnode).Lower, newName, flags)
}

func (n *cnode) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	h, e := n.Lower.Open(ctx, flags)
	if e != 0 {
		return nil, e
	}
	n.c.handles.Add(1)
	return &chandle{Handle: h, c: n.c}, 0
}

func (n *cnode) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	d, e := n.Lower.OpenDir(ctx)
	if e != 0 {
		return nil, e
	}
	n.c.dirs.Add(1)
	return &cdir{DirStream: d, c: n.c}, 0
}

func (n *cnode) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if ch, ok := h.(*chandle); ok {
		h = ch.Handle
	}
	return n.Lower.Getattr(ctx, h, out)
}

func (n *cnode) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if ch, ok := h.(*chandle); ok {
		h = ch.Handle
	}
	return n.Lower.Setattr(ctx, h, in, out)
}

type chandle struct {
	layer.Handle
	c    *counts
	done atomic.Bool
}

func (h *chandle) Read(ctx context.Context, dest []byte, off int64) (int, layer.Errno) {
	if off < 0 || off > math.MaxInt64-int64(len(dest)) {
		h.c.overflow.Add(1)
	}
	return h.Handle.Read(ctx, dest, off)
}

func (h *chandle) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	if off < 0 || off > math.MaxInt64-int64(len(data)) {
		h.c.overflow.Add(1)
	}
	c, _ := layer.CallerOf(ctx)
	h.c.view.Store(c.View)
	return h.Handle.Write(ctx, data, off)
}

func (h *chandle) Release(ctx context.Context) layer.Errno {
	if !h.done.CompareAndSwap(false, true) {
		h.c.twice.Add(1)
		return 0
	}
	h.c.handles.Add(-1)
	return h.Handle.Release(ctx)
}

type cdir struct {
	layer.DirStream
	c    *counts
	done atomic.Bool
	read int64 // entries returned
}

func (d *cdir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if d.read > 0 && d.c.dirFail.CompareAndSwap(d.read, 0) {
		return layer.DirEntry{}, false, syscall.EIO
	}
	ent, ok, e := d.DirStream.Next(ctx)
	if ok {
		d.read++
	}
	return ent, ok, e
}

func (d *cdir) Seek(ctx context.Context, off uint64) layer.Errno {
	d.read = 0
	return d.DirStream.Seek(ctx, off)
}

func (d *cdir) Close() {
	if !d.done.CompareAndSwap(false, true) {
		d.c.twice.Add(1)
		return
	}
	d.c.dirs.Add(-1)
	d.DirStream.Close()
}

// fixture is a stack over a temporary directory, served by an export.
type fixture struct {
	dir  string
	st   *stack.Stack
	host layer.Node // hostfs's root
	root *cnode     // the counting layer's root, which the export serves
	c    *counts
	s    *Server
}

func newFixture(t testing.TB, opts Options) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir(), st: stack.New(stack.Options{}), c: &counts{}}
	var err error
	f.host, err = hostfs.New(f.st, f.dir)
	if err != nil {
		t.Fatal(err)
	}
	f.root = &cnode{PassThrough: layer.PassThrough{Lower: f.host}, c: f.c, root: true}
	f.s = New(f.st, map[string]layer.Node{"": f.root}, opts)
	t.Cleanup(func() { f.host.Forget() })
	return f
}

// session is a client connection to a fixture's server.
type session struct {
	cl   *p9.Client
	root p9.File
	conn net.Conn      // the client's end
	done chan struct{} // closed when ServeConn has returned
}

// dial connects with hugelgupf/p9's client, an independent one, and
// attaches aname. That client names no user: it attaches as nobody.
func (f *fixture) dial(t testing.TB, aname string) *session {
	t.Helper()
	s, err := f.tryDial(aname)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cut(t) })
	return s
}

func (f *fixture) tryDial(aname string) (*session, error) {
	cli, srv := net.Pipe()
	s := &session{conn: cli, done: make(chan struct{})}
	go func() {
		f.s.ServeConn(srv)
		close(s.done)
	}()
	cl, err := p9.NewClient(cli, p9.WithMessageSize(256<<10))
	if err != nil {
		cli.Close()
		<-s.done
		return nil, err
	}
	s.cl = cl
	s.root, err = cl.Attach(aname)
	if err != nil {
		cl.Close()
		<-s.done
		return nil, err
	}
	return s, nil
}

// cut ends the connection as a crash would, without clunking, and waits
// for the server to have released it.
func (s *session) cut(t testing.TB) {
	t.Helper()
	s.conn.Close()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return after the connection was cut")
	}
	if s.cl != nil {
		s.cl.Close()
	}
}

// walk walks names from f.
func walk(t testing.TB, f p9.File, names ...string) p9.File {
	t.Helper()
	_, nf, err := f.Walk(names)
	if err != nil {
		t.Fatalf("walk %q: %v", names, err)
	}
	return nf
}

// Raw 9P2000.L frames, for what the library's client cannot send
// (xattrs, a uid, oversized messages) and for the fuzz corpus.

const (
	tStatfs      = 8
	tLopen       = 12
	tLcreate     = 14
	tGetattr     = 24
	tXattrwalk   = 30
	tXattrcreate = 32
	tReaddir     = 40
	tLock        = 52
	tGetlock     = 54
	tMkdir       = 72
	tUnlinkat    = 76
	tVersion     = 100
	tFlush       = 108
	tAttach      = 104
	tWalk        = 110
	tRead        = 116
	tWrite       = 118
	tClunk       = 120
	tSetattr     = 26
	rLerror      = 7
)

// frame builds a message of type typ with tag; fields are uint8, uint16,
// uint32, uint64, string (9P string) or []byte (raw).
func frame(typ uint8, tag uint16, fields ...any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0, 0, typ})
	binary.Write(&b, binary.LittleEndian, tag)
	for _, f := range fields {
		switch v := f.(type) {
		case string:
			binary.Write(&b, binary.LittleEndian, uint16(len(v)))
			b.WriteString(v)
		case []byte:
			b.Write(v)
		default:
			binary.Write(&b, binary.LittleEndian, v)
		}
	}
	out := b.Bytes()
	binary.LittleEndian.PutUint32(out, uint32(len(out)))
	return out
}

func twalk(tag uint16, fid, newfid uint32, names ...string) []byte {
	f := []any{fid, newfid, uint16(len(names))}
	for _, n := range names {
		f = append(f, n)
	}
	return frame(tWalk, tag, f...)
}

// raw is a connection speaking frames directly.
type raw struct {
	c    net.Conn
	done chan struct{}
}

func (f *fixture) rawDial(t testing.TB) *raw {
	t.Helper()
	return f.rawOver(t, func(c net.Conn) net.Conn { return c })
}

// rawOver is rawDial with the server's end of the connection as wrap
// makes it (another peer).
func (f *fixture) rawOver(t testing.TB, wrap func(net.Conn) net.Conn) *raw {
	t.Helper()
	cli, srv := net.Pipe()
	r := &raw{c: cli, done: make(chan struct{})}
	go func() {
		f.s.ServeConn(wrap(srv))
		close(r.done)
	}()
	t.Cleanup(func() {
		cli.Close()
		<-r.done
	})
	return r
}

// rpc sends m and returns the reply's type and body.
func (r *raw) rpc(t testing.TB, m []byte) (uint8, []byte) {
	t.Helper()
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write(m); err != nil {
		t.Fatalf("send: %v", err)
	}
	typ, body, err := r.recv()
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return typ, body
}

func (r *raw) recv() (uint8, []byte, error) {
	var hdr [7]byte
	if _, err := io.ReadFull(r.c, hdr[:]); err != nil {
		return 0, nil, err
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	if size < 7 || size > 16<<20 {
		return 0, nil, fmt.Errorf("bad reply size %d", size)
	}
	body := make([]byte, size-7)
	_, err := io.ReadFull(r.c, body)
	return hdr[4], body, err
}

// must sends m and returns the reply's body, failing on an Rlerror.
func (r *raw) must(t testing.TB, what string, m []byte) []byte {
	t.Helper()
	typ, body := r.rpc(t, m)
	if typ == rLerror {
		t.Fatalf("%s: Rlerror %d", what, binary.LittleEndian.Uint32(body))
	}
	return body
}

// lerror returns an Rlerror's errno, or an error if the reply is not one.
func lerror(typ uint8, body []byte) (uint32, error) {
	if typ != rLerror || len(body) < 4 {
		return 0, errors.New("not an Rlerror")
	}
	return binary.LittleEndian.Uint32(body), nil
}

// handshake negotiates msize and attaches fid 0 as uid.
func (r *raw) handshake(t testing.TB, msize uint32, uid uint32) {
	t.Helper()
	r.must(t, "version", frame(tVersion, 0xffff, msize, "9P2000.L"))
	r.must(t, "attach", frame(tAttach, 1, uint32(0), ^uint32(0), "", "", uid))
}

// openRW attaches fid 0 as root and opens name below it read-write as
// fid 1.
func (r *raw) openRW(t testing.TB, name string) {
	t.Helper()
	r.handshake(t, 64<<10, 0)
	r.must(t, "walk", twalk(1, 0, 1, name))
	r.must(t, "open", frame(tLopen, 1, uint32(1), uint32(2)))
}

func tlock(tag uint16, fid uint32, typ p9.LockType, flags p9.LockFlags, start, length uint64) []byte {
	return frame(tLock, tag, fid, uint8(typ), uint32(flags), start, length, uint32(42), "client")
}

// lock sends a Tlock for fid and returns the status.
func (r *raw) lock(t testing.TB, fid uint32, typ p9.LockType, flags p9.LockFlags, start, length uint64) p9.LockStatus {
	t.Helper()
	body := r.must(t, "lock", tlock(1, fid, typ, flags, start, length))
	return p9.LockStatus(body[0])
}

// connViews are the coherence views of the server's connections.
func (s *Server) connViews() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var vs []uint32
	for c := range s.conns {
		c.mu.Lock()
		for _, v := range c.views {
			vs = append(vs, v)
		}
		c.mu.Unlock()
	}
	return vs
}
