package hostfs

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// The inotify watcher is Watch's fallback where fanotify cannot watch (not
// root, or a lower file system it cannot mark).
//
// What it watches. inotify watches one directory at a time, so the
// watcher watches the root at once, every directory beneath it by a walk in
// the background, new ones as they appear (created or moved in), and each
// directory the FS gives up the stack (adopt) before the lookup that found
// it returns. A view can cache nothing of a directory before then, so
// however far the walk has got, no change a view could have cached is
// missed. The walk adds what lookups do not need: a file changed through a
// hard link in a directory no view has looked at.
//
// Each event becomes the events fanotify's would: the directory's Entries
// with the name for a name created, removed or moved; the file's Data for a
// write or a close after writing (stores through a shared mapping make no
// write event), and for a move in, as a write under the old name may not
// have been resolvable (below); its Attrs otherwise. inotify reports names,
// not files: the file's token comes from stat'ing the name, through a
// descriptor the watcher keeps of each directory it watches. A file written
// and then removed before the watcher stats its name is told as removed
// only, which matters only where it is still open or linked elsewhere.
//
// shale's own changes. inotify reports no pid, so it reports the changes
// shale makes too, which the FS has raised already, before the request
// returned. They are raised again a moment later, with no view: harmless
// duplicates, which cost every view (the writer's too) what it cached of
// the file. Measured through loop and null views on two busy cores:
// creating 2,000 small files, writing 256 MiB and reading it back took as
// long as with fanotify, within the noise; writing 4 KiB and at once
// reading the 1 MiB file back, 500 times, took up to twice as long, as its
// pages are read again. Suppressing them by matching shale's recent
// changes is not safe: the kernel merges an event into an identical one
// still queued, so a change another program made to the same file in that
// moment would be swallowed with shale's, and timestamps are too coarse to
// tell two writes apart. Events read in one batch are raised once each:
// they all happened before the batch was read.
//
// Limits. Each watch counts against fs.inotify.max_user_watches, and the
// watcher keeps at most a quarter of RLIMIT_NOFILE in descriptors. When
// either runs out it logs so once and covers what it has: the walk stops,
// and a directory given up the stack takes the watch of one only the walk
// found. Changes beside shale in directories left unwatched, and in those
// the shale process may not read (inotify needs read permission), are seen
// only when the views' caches expire.

const inotifyMask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

type inotifyWatch struct {
	fs  *FS
	fd  int      // the inotify instance
	f   *os.File // the same, to read
	log *slog.Logger

	mu      sync.Mutex
	byWd    map[int]*watchedDir
	byToken map[layer.Token]*watchedDir
	most    int // watches, each with a descriptor
	warned  map[error]bool
	closed  bool
}

// watchedDir is a directory the watcher watches.
type watchedDir struct {
	wd     int
	fd     int // to stat names in it
	token  layer.Token
	met    bool // the FS gave a node of it up the stack
	walked bool // the walk has gone, or goes, beneath it
}

func (fs *FS) watchInotify(root *node, log *slog.Logger) (stop func(), err error) {
	w, err := fs.newInotify(log)
	if err != nil {
		return nil, err
	}
	if err := w.start(root); err != nil {
		w.stop()
		return nil, fmt.Errorf("inotify watch on %s: %v", fs.dir, err)
	}
	return w.stop, nil
}

func (fs *FS) newInotify(log *slog.Logger) (*inotifyWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %v", err)
	}
	w := &inotifyWatch{
		fs: fs, fd: fd, f: os.NewFile(uintptr(fd), "inotify"), log: log,
		byWd: map[int]*watchedDir{}, byToken: map[layer.Token]*watchedDir{},
		most: 1 << 20, warned: map[error]bool{},
	}
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) == nil {
		w.most = int(min(l.Cur/4, 1<<20))
	}
	return w, nil
}

// start watches the root and starts the reader and the walk.
func (w *inotifyWatch) start(root *node) error {
	fd, e := root.use()
	if e != 0 {
		return e
	}
	defer root.done()
	if _, err := w.add(fd, root.token, true); err != nil {
		return err
	}
	walk, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	w.fs.inotify.Store(w)
	go w.read()
	go w.tree(walk)
	return nil
}

func (w *inotifyWatch) stop() {
	w.fs.inotify.CompareAndSwap(w, nil)
	w.mu.Lock()
	w.closed = true
	for _, d := range w.byWd {
		unix.Close(d.fd)
	}
	clear(w.byWd)
	clear(w.byToken)
	w.mu.Unlock()
	w.f.Close()
}

// watchDir watches the directory fd holds, if inotify watches, before a
// node of it goes up the stack.
func (fs *FS) watchDir(fd int, st *unix.Statx_t) {
	if w := fs.inotify.Load(); w != nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		w.add(fd, fs.token(fd, "", st), true) // a failure is logged
	}
}

// add watches the directory fd holds unless it is watched already, and
// returns its watch. met marks it as given up the stack: when watches or
// descriptors run out, such a one takes the watch of one only the walk
// found.
func (w *inotifyWatch) add(fd int, tok layer.Token, met bool) (*watchedDir, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.byToken[tok]; d != nil {
		d.met = d.met || met
		return d, nil
	}
	for {
		d, err := w.addLocked(fd, tok)
		if err == nil {
			d.met = met
			return d, nil
		}
		if !met || (err != unix.ENOSPC && err != unix.EMFILE) || !w.evict() {
			w.warn(err)
			return nil, err
		}
	}
}

func (w *inotifyWatch) addLocked(fd int, tok layer.Token) (*watchedDir, error) {
	if w.closed {
		return nil, os.ErrClosed
	}
	if len(w.byWd) >= w.most {
		return nil, unix.EMFILE
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	wd, err := unix.InotifyAddWatch(w.fd, procPath(own), inotifyMask)
	if err != nil {
		unix.Close(own)
		return nil, err
	}
	if old := w.byWd[wd]; old != nil {
		// The same directory under another token (gen.go mints new ones
		// for files no node holds, where it has nothing better).
		w.forget(old)
	}
	d := &watchedDir{wd: wd, fd: own, token: tok}
	w.byWd[wd] = d
	w.byToken[tok] = d
	return d, nil
}

// evict gives up the watch of a directory only the walk found.
func (w *inotifyWatch) evict() bool {
	for _, d := range w.byWd {
		if !d.met {
			unix.InotifyRmWatch(w.fd, uint32(d.wd))
			w.forget(d)
			return true
		}
	}
	return false
}

func (w *inotifyWatch) forget(d *watchedDir) {
	delete(w.byWd, d.wd)
	delete(w.byToken, d.token)
	unix.Close(d.fd)
}

// warn logs, once for each error, what the watcher cannot cover.
func (w *inotifyWatch) warn(err error) {
	if err == os.ErrClosed || err == unix.ENOENT || err == unix.ENOTDIR || w.warned[err] {
		return // closing, or the directory went
	}
	w.warned[err] = true
	limit, _ := os.ReadFile("/proc/sys/fs/inotify/max_user_watches")
	w.log.Warn("inotify cannot watch every directory of the lower tree: changes made beside shale in those it does not watch show only when caches expire",
		"lower", w.fs.dir, "err", err, "watches", len(w.byWd), "max_user_watches", strings.TrimSpace(string(limit)))
}

// tree watches the directory fd holds and, the first time, every one
// beneath it, depth first. It closes fd, and tells whether to go on: not
// once watches or descriptors ran out.
func (w *inotifyWatch) tree(fd int) bool {
	defer unix.Close(fd)
	var st unix.Statx_t
	if statx(fd, &st) != nil {
		return true
	}
	d, err := w.add(fd, w.fs.token(fd, "", &st), false)
	if err != nil {
		return err == unix.EACCES || err == unix.ENOENT || err == unix.ENOTDIR
	}
	w.mu.Lock()
	first := !d.walked
	d.walked = true
	w.mu.Unlock()
	if !first {
		return true
	}
	rd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true
	}
	ds := &dir{fd: rd, buf: make([]byte, 32<<10)}
	defer ds.Close()
	for {
		e, ok, errno := ds.Next(context.Background())
		if errno != 0 || !ok {
			return true
		}
		if e.Name == "." || e.Name == ".." || (e.Type != unix.S_IFDIR && e.Type != 0) {
			continue // 0: the file system does not say
		}
		c, err := unix.Openat(rd, e.Name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil && !w.tree(c) {
			return false
		}
	}
}

func (w *inotifyWatch) read() {
	d := newDrainer(w.f, w.batch)
	w.fs.st.Events().OnSync(d.sync)
	d.run()
}

// batch raises the events of one read, each once, and watches the
// directories that appeared.
func (w *inotifyWatch) batch(b []byte) {
	var evs []layer.Event
	var dirs []int
	w.mu.Lock()
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int(int32(binary.NativeEndian.Uint32(b[0:])))
		mask := binary.NativeEndian.Uint32(b[4:])
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
		if end > len(b) {
			break
		}
		name := b[unix.SizeofInotifyEvent:end]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		b = b[end:]
		evs, dirs = w.noticed(evs, dirs, wd, mask, string(name))
	}
	w.mu.Unlock()
	// Raised outside w.mu: invalidations wait for the kernel, which may
	// wait for a lookup that waits for w.mu (watchDir).
	seen := map[layer.Event]bool{}
	for _, ev := range evs {
		if !seen[ev] {
			seen[ev] = true
			w.fs.st.Events().Raise(ev)
		}
	}
	for _, fd := range dirs {
		go w.tree(fd)
	}
}

// noticed adds the events one inotify event stands for to evs, and the
// descriptor of a directory that appeared to dirs; w.mu is held.
func (w *inotifyWatch) noticed(evs []layer.Event, dirs []int, wd int, mask uint32, name string) ([]layer.Event, []int) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return append(evs, layer.Event{Kind: layer.Everything}), dirs
	}
	d := w.byWd[wd]
	switch {
	case d == nil:
		return evs, dirs
	case mask&unix.IN_IGNORED != 0:
		w.forget(d)
		return evs, dirs
	case name == "": // the directory itself: its attributes, or its removal
		return append(evs, layer.Event{Kind: layer.Attrs, Token: d.token}), dirs
	}
	if mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
		evs = append(evs, layer.Event{Kind: layer.Entries, Token: d.token, Name: name})
	}
	if mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0 {
		return evs, dirs
	}
	var st unix.Statx_t
	if unix.Statx(d.fd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st) != nil {
		return evs, dirs // gone since; its removal follows
	}
	kind := layer.Attrs
	if mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0 {
		kind = layer.Data
	}
	evs = append(evs, layer.Event{Kind: kind, Token: w.fs.token(d.fd, name, &st)})
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if fd, err := unix.Openat(d.fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			dirs = append(dirs, fd)
		}
	}
	return evs, dirs
}
