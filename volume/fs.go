package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// FS is a mounted volume: the bottom of a stack.
//
// Lock order: fileState.flushMu, then fileState.mu, then FS.mu. The
// others are leaves, nothing taken or called under them: node.mu,
// mcache.mu (mcache.go), blockCache.mu, fetches.mu, a handle's
// seqReads.mu and an upload's (blockStore.putAll), and
// etcdEngine.leaseMu. No lock is held across a request to etcd or S3 but
// flushMu (only write-backs of that one file wait on it) and leaseMu
// (while a lease is granted).
type FS struct {
	eng    Engine
	k      keys
	f      Format
	blocks *blockStore
	st     *stack.Stack
	log    *slog.Logger
	cancel context.CancelFunc // ends the watch

	mu      sync.Mutex
	files   map[uint64]*fileState // open files of this client
	seen    map[uint64]served     // what this client's kernel may hold of each file (file.go)
	own     map[int64]bool        // revisions of our own commits, for the watch
	flying  map[*flight]bool      // our transactions not yet recorded in own
	meta    mcache                // the namespace as the watch keeps it (mcache.go)
	syncKey string                // this client's sync mark (watch.go)
	inoNext uint64                // the inode numbers this client may hand out
	inoEnd  uint64
	timeout time.Duration // of every request to etcd and S3
}

// Options tune a mounted volume.
type Options struct {
	// CacheSize bounds the blocks kept: in memory (0: 256 MiB), or with
	// CacheDir on disk there, with at most 256 MiB of them in memory too.
	CacheSize int64
	CacheDir  string // the disk cache's directory (diskcache.go); "": none
	Logger    *slog.Logger
}

// Open mounts the volume u on stack st and returns its root.
func Open(ctx context.Context, st *stack.Stack, u URL, o Options) (*FS, layer.Node, error) {
	eng, err := DialEtcd(ctx, u.Etcd)
	if err != nil {
		return nil, nil, err
	}
	fs, err := openOn(ctx, st, eng, u.Name, o)
	if err != nil {
		eng.Close()
		return nil, nil, err
	}
	return fs, &rootNode{node{fs: fs, ino: rootIno}}, nil
}

func openOn(ctx context.Context, st *stack.Stack, eng Engine, name string, o Options) (*FS, error) {
	k := newKeys(name)
	b, err := eng.Get(ctx, k.format())
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("no volume %s there: make it with shale format", name)
	}
	var f Format
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("volume %s: bad format record: %v", name, err)
	}
	if f.Version != formatVersion {
		return nil, fmt.Errorf("volume %s has format %d; this shale reads format %d", name, f.Version, formatVersion)
	}
	if o.Logger == nil {
		o.Logger = st.Log()
	}
	// The watch starts at the revision the format was read at or later:
	// what changes after this point reaches the kernel.
	_, rev, err := eng.List(ctx, k.format(), 1)
	if err != nil {
		return nil, err
	}
	bs, err := openBlocks(ctx, f, o)
	if err != nil {
		return nil, err
	}
	fs := &FS{eng: eng, k: k, f: f, blocks: bs, st: st, log: o.Logger,
		files: map[uint64]*fileState{}, seen: map[uint64]served{}, own: map[int64]bool{}, flying: map[*flight]bool{},
		timeout: 60 * time.Second}
	fs.meta.reset()
	fs.syncKey = k.p + "c/" + newID()
	wctx, cancel := context.WithCancel(context.Background())
	fs.cancel = cancel
	// SHALE_VOLUME_WATCH=off is for tests: that what close-to-open
	// promises holds without the watch.
	if os.Getenv("SHALE_VOLUME_WATCH") != "off" {
		go fs.watch(wctx, rev)
	}
	return fs, nil
}

// Format is the volume's format record.
func (fs *FS) Format() Format { return fs.f }

// Close ends the watch and the connection; open files are written back
// first by their handles' Flush, as the kernel closes them at unmount.
func (fs *FS) Close() error {
	fs.cancel()
	err := fs.blocks.close()
	if eerr := fs.eng.Close(); err == nil {
		err = eerr
	}
	return err
}

// errnoOf is the Errno for an error of a request: ours as they are, the
// engines' as EIO (said in the log, where the user can find why).
func (fs *FS) errnoOf(what string, err error) layer.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	fs.log.Warn("volume request failed", "op", what, "volume", fs.f.Name, "err", err)
	return syscall.EIO
}

// ctx bounds a request so that an engine that is gone fails it with EIO
// rather than hanging the caller for ever. The caller's cancellation is
// not followed: go-fuse cancels on the kernel's INTERRUPT, which any
// signal to the calling thread brings (Go's own preemption, SIGURG), and
// an operation half done is worse than one finished.
func (fs *FS) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), fs.timeout)
}

// update runs fn as one transaction on the namespace (ntx.go) and
// remembers its revision as ours.
func (fs *FS) update(ctx context.Context, what string, fn func(t *ntx) error) layer.Errno {
	ctx, cancel := fs.ctx(ctx)
	defer cancel()
	lease, err := fs.eng.Lease(ctx)
	if err != nil {
		fs.log.Warn("no etcd lease: files removed while open are removed at once", "volume", fs.f.Name, "err", err)
	}
	var t *ntx
	var ct *cacheTx
	fl := fs.takeOff()
	var rev int64
	// The first try takes what the cache knows as read; an error it
	// leads to (EEXIST, ENOENT) is made sure of by a try that reads.
	for try := 0; try < 2; try++ {
		tries := 0
		rev, err = fs.eng.Txn(ctx, func(tx Tx) error {
			ct = newCacheTx(fs, tx, try == 0 && tries == 0)
			tries++
			t = &ntx{fs: fs, tx: ct, inodes: map[uint64]*Inode{}, dirty: map[uint64]bool{}, now: nowNs(), lease: lease}
			if err := fn(t); err != nil {
				return err
			}
			t.commit()
			return nil
		})
		var errno syscall.Errno
		if !errors.As(err, &errno) || !ct.assumed {
			break
		}
	}
	if err == nil && rev != 0 {
		// Before land: the watch waits for it to pass rev.
		fs.meta.committed(fs.k, rev, ct, t.made, t.madeDirs)
	}
	fs.land(fl, rev)
	if err == nil {
		for _, ino := range t.removed {
			fs.gone(ino)
		}
		for _, ino := range t.kept {
			fs.orphaned(ino)
		}
	}
	return fs.errnoOf(what, err)
}

// A flight is one of our transactions between its start and the record
// of its revision. The watch may deliver the revision before it is
// recorded; it then waits for the flights under way, so that it never
// takes our own change for another client's: telling the kernel of a
// change its own request is making would send an invalidation that waits
// for the directory lock that request holds, and a kill -9 of the
// process then would leave it stuck for ever.
type flight struct{ done chan struct{} }

func (fs *FS) takeOff() *flight {
	fl := &flight{done: make(chan struct{})}
	fs.mu.Lock()
	fs.flying[fl] = true
	fs.mu.Unlock()
	return fl
}

// land records rev (0: nothing committed) as ours and ends the flight.
func (fs *FS) land(fl *flight, rev int64) {
	fs.mu.Lock()
	if rev != 0 {
		fs.own[rev] = true
	}
	delete(fs.flying, fl)
	fs.mu.Unlock()
	close(fl.done)
}

// isOwn tells whether rev is one of our commits, waiting for the flights
// under way if it is not recorded yet.
func (fs *FS) isOwn(rev int64) bool {
	fs.mu.Lock()
	mine := fs.own[rev]
	var wait []*flight
	if !mine {
		for fl := range fs.flying {
			wait = append(wait, fl)
		}
	}
	fs.mu.Unlock()
	if mine || len(wait) == 0 {
		return mine
	}
	for _, fl := range wait {
		<-fl.done
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.own[rev]
}

// newIno hands out an inode number. Numbers are taken from the volume's
// counter a thousand at a time, so most creations cost no extra request.
func (fs *FS) newIno(ctx context.Context) (uint64, error) {
	fs.mu.Lock()
	if fs.inoNext < fs.inoEnd {
		n := fs.inoNext
		fs.inoNext++
		fs.mu.Unlock()
		return n, nil
	}
	fs.mu.Unlock()
	const batch = 1000
	var first uint64
	ctx, cancel := fs.ctx(ctx)
	defer cancel()
	fl := fs.takeOff()
	rev, err := fs.eng.Txn(ctx, func(tx Tx) error {
		v, err := tx.Get(fs.k.next())
		if err != nil {
			return err
		}
		if first, err = strconv.ParseUint(string(v[0]), 10, 64); err != nil {
			return fmt.Errorf("bad inode counter %q", v[0])
		}
		tx.Put(fs.k.next(), []byte(strconv.FormatUint(first+batch, 10)))
		return nil
	})
	fs.land(fl, rev)
	if err != nil {
		return 0, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.inoNext, fs.inoEnd = first+1, first+batch
	return first, nil
}

// raise tells the stack that ino changed, on behalf of ctx's view.
func (fs *FS) raise(ctx context.Context, kind layer.EventKind, ino uint64, name string) {
	if !fs.st.Events().Active() {
		return
	}
	fs.st.Events().RaiseIn(ctx, layer.Event{Kind: kind, Token: token(ino), Name: name, View: layer.ViewOf(ctx)})
}

// token is the identity of inode ino: inode numbers are never reused.
func token(ino uint64) layer.Token { return layer.Token{Ino: ino, Gen: 1} }

// fill turns an inode record into an Attr.
func (fs *FS) fill(ino uint64, in *Inode, out *layer.Attr) {
	*out = layer.Attr{Ino: ino, Mode: in.Mode, Nlink: in.Nlink, Uid: in.Uid, Gid: in.Gid, Rdev: in.Rdev,
		Size: in.Size, Blksize: uint32(min(fs.f.BlockSize, 1<<20)),
		Atime: time.Unix(0, in.Atime), Mtime: time.Unix(0, in.Mtime), Ctime: time.Unix(0, in.Ctime)}
	switch in.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		out.Size = 4096
		out.Blocks = 8
	case syscall.S_IFLNK:
		out.Size = uint64(len(in.Target))
	case syscall.S_IFREG:
		var n uint64
		for _, b := range in.Blocks {
			if b.ID != "" {
				n += uint64(b.Len)
			}
		}
		out.Blocks = (n + 511) / 512
	}
}

// getInode is inode ino as the metadata cache knows it, else as read.
func (fs *FS) getInode(ctx context.Context, ino uint64) (*Inode, error) {
	if v, ok := fs.meta.get(fs.k, fs.k.inode(ino)); ok && v.Val != nil {
		return decodeInode(v.Val)
	}
	in, _, err := fs.readInode(ctx, ino)
	return in, err
}

// readInode reads inode ino from etcd (an open: close-to-open), and the
// revision of its last change.
func (fs *FS) readInode(ctx context.Context, ino uint64) (*Inode, int64, error) {
	vs, err := fs.read(ctx, fs.k.inode(ino))
	if err != nil {
		return nil, 0, err
	}
	if vs[0].Val == nil {
		return nil, 0, syscall.ENOENT
	}
	in, err := decodeInode(vs[0].Val)
	return in, vs[0].Mod, err
}

// read reads keys from etcd in one request, and tells the cache.
func (fs *FS) read(ctx context.Context, keys ...string) ([]Value, error) {
	ctx, cancel := fs.ctx(ctx)
	defer cancel()
	vs, rev, err := fs.eng.Read(ctx, keys...)
	if err != nil {
		return nil, err
	}
	fs.meta.read(fs.k, rev, keys, vs)
	return vs, nil
}

// A volume is the bottom of stacks whose lower is etcd://HOSTS/NAME.
func init() {
	stack.RegisterBackend(stack.Backend{Scheme: "etcd", Open: func(st *stack.Stack, lower string) (layer.Node, error) {
		u, err := ParseURL(lower)
		if err != nil {
			return nil, err
		}
		_, root, err := Open(context.Background(), st, u, Options{Logger: st.Log(), CacheDir: u.CacheDir, CacheSize: u.CacheSize})
		return root, err
	}})
}
