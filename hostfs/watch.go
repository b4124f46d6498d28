package hostfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// How Watch may notice changes made beside shale.
const (
	WatchAuto     = "auto"     // fanotify where it works, else inotify
	WatchFanotify = "fanotify" // a filesystem mark: root, on file systems with handles
	WatchInotify  = "inotify"  // a watch on each directory: anyone (inotify.go)
)

// Watch notices changes that other programs make beneath root's directory
// and raises them as events, with View 0, like the changes made through
// the FS. how says with what (WatchAuto, WatchFanotify, WatchInotify);
// log hears which watcher auto chose, and what inotify cannot cover.
// stop ends the watch.
//
// fanotify with a filesystem mark reports every change on the lower file
// system with file handles, and the pid that made it, so events of shale's
// own process are skipped: the FS raised them already. It needs root, and
// a file system it can mark (not some FUSE or overlay lowers); where it
// cannot, auto falls back to inotify.
func Watch(root layer.Node, how string, log *slog.Logger) (stop func(), err error) {
	n, ok := root.(*node)
	if !ok {
		return nil, errors.New("hostfs.Watch: not a hostfs node")
	}
	switch how {
	case WatchFanotify:
		return n.fs.watchFanotify()
	case WatchInotify:
		return n.fs.watchInotify(n, log)
	case WatchAuto:
		stop, err := n.fs.watchFanotify()
		if err == nil {
			return stop, nil
		}
		log.Info("watching the lower directory with inotify", "lower", n.fs.dir, "fanotify", err)
		return n.fs.watchInotify(n, log)
	}
	return nil, fmt.Errorf("no watcher %q: say %s, %s or %s", how, WatchAuto, WatchFanotify, WatchInotify)
}

func (fs *FS) watchFanotify() (stop func(), err error) {
	// Non-blocking, so that closing it ends the pending read.
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_REPORT_FID|unix.FAN_REPORT_DFID_NAME, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fanotify: %v (it needs root)", err)
	}
	// CLOSE_WRITE: stores through a shared mapping make no MODIFY.
	const mask = unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE | unix.FAN_ATTRIB | unix.FAN_CREATE | unix.FAN_DELETE |
		unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_ONDIR
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, mask, unix.AT_FDCWD, fs.dir); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fanotify mark on %s: %v", fs.dir, err)
	}
	f := os.NewFile(uintptr(fd), "fanotify")
	go fs.watch(f)
	return func() { f.Close() }, nil
}

func (fs *FS) watch(f *os.File) {
	self := int32(os.Getpid())
	d := newDrainer(f, func(b []byte) {
		for len(b) >= unix.FAN_EVENT_METADATA_LEN {
			evLen := binary.NativeEndian.Uint32(b[0:])
			metaLen := binary.NativeEndian.Uint16(b[6:])
			if evLen < uint32(metaLen) || int(evLen) > len(b) {
				break
			}
			mask := binary.NativeEndian.Uint64(b[8:])
			pid := int32(binary.NativeEndian.Uint32(b[20:]))
			if mask&unix.FAN_Q_OVERFLOW != 0 {
				fs.st.Events().Raise(layer.Event{Kind: layer.Everything})
			} else if pid != self {
				fs.noticed(mask, b[metaLen:evLen])
			}
			b = b[evLen:]
		}
	})
	fs.st.Events().OnSync(d.sync)
	d.run()
}

// noticed turns one fanotify event into events of the FS.
func (fs *FS) noticed(mask uint64, info []byte) {
	var object, dir *layer.Token
	var name string
	for len(info) >= 4 {
		typ, l := info[0], int(binary.NativeEndian.Uint16(info[2:]))
		if l < 4 || l > len(info) {
			return
		}
		rec := info[4:l]
		info = info[l:]
		// fsid (8 bytes), then struct file_handle, then for DFID_NAME a
		// NUL-terminated name.
		if len(rec) < 16 {
			continue
		}
		hlen := int(binary.NativeEndian.Uint32(rec[8:]))
		htype := int32(binary.NativeEndian.Uint32(rec[12:]))
		if 16+hlen > len(rec) {
			continue
		}
		tok, ok := fs.tokenOfHandle(unix.NewFileHandle(htype, rec[16:16+hlen]))
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_FID:
			if ok {
				object = &tok
			}
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			if ok {
				dir = &tok
			}
			nm := rec[16+hlen:]
			for i, c := range nm {
				if c == 0 {
					nm = nm[:i]
					break
				}
			}
			name = string(nm)
		}
	}
	if dir != nil && mask&(unix.FAN_CREATE|unix.FAN_DELETE|unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO) != 0 {
		fs.st.Events().Raise(layer.Event{Kind: layer.Entries, Token: *dir, Name: name})
	}
	if object == nil && name == "." {
		object = dir // a directory's own event names it "." in itself
	}
	if object != nil {
		kind := layer.Attrs
		if mask&(unix.FAN_MODIFY|unix.FAN_CLOSE_WRITE) != 0 {
			kind = layer.Data
		}
		fs.st.Events().Raise(layer.Event{Kind: kind, Token: *object})
	}
}

// tokenOfHandle finds the token of the file a handle names, if it still
// exists on the root's file system.
func (fs *FS) tokenOfHandle(h unix.FileHandle) (layer.Token, bool) {
	fd, err := unix.OpenByHandleAt(fs.fds.mountFd, h, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return layer.Token{}, false
	}
	defer unix.Close(fd)
	var st unix.Statx_t
	if statx(fd, &st) != nil {
		return layer.Token{}, false
	}
	return fs.token(fd, "", &st), true
}
