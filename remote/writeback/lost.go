package writeback

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/shalefs/shale/internal/statedir"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/session"
)

// Delayed writes that cannot be written back (another client wrote the
// file, or removed it, while this one could not reach the server; the
// server refused the write; the client ended with the server gone) are
// a real conflict: the client cannot tell which bytes should win. They
// are not dropped: the client keeps them in a conflict copy on its own
// machine, under Config.LostDir, where the user who wrote them finds
// them (the server may be unreachable, or the name taken by another's
// file), says so in one log line naming the file and the copy, counts
// them as lost, and fails the file's next fsync or close with EIO.

// defaultLostDir is where conflict copies go: the state directory's
// lost/ (/var/lib/shale/lost as root).
func defaultLostDir() string { return filepath.Join(statedir.Dir(), "lost") }

// lostLocked keeps sf's dirty data that cannot be written back in a
// conflict copy, drops it from the client, says so in one log line, and
// keeps EIO for the file's next fsync or close.
func (w *Files) lostLocked(sf *sfile, why string, attrs ...any) layer.Errno {
	name := ""
	if sf.f != nil {
		if names, e := sf.f.Path(); e == 0 {
			name = "/" + strings.Join(names, "/")
		}
	}
	n := sf.d.bytes()
	copyPath, err := w.conflictCopy(sf, name)
	shown := name
	if shown == "" {
		shown = fmt.Sprintf("(no name left; qid path %d)", sf.tok.Ino)
	}
	if err != nil {
		w.Log.Error("delayed writes lost, and no conflict copy could be kept: "+why, append([]any{"file", shown, "server", w.Where, "bytes", n, "err", err}, attrs...)...)
	} else {
		w.Log.Error("delayed writes not written back, kept in a conflict copy: "+why, append([]any{"file", shown, "server", w.Where, "bytes", n, "copy", copyPath}, attrs...)...)
	}
	w.Ctr.Lost.Add(uint64(n))
	w.dropDirtyLocked(sf)
	sf.err.Store(uint32(syscall.EIO))
	return syscall.EIO
}

// conflictCopy writes sf's dirty extents at their offsets into a new
// file of w.LostDir, named after the server and the file's name (or its
// QID path), owned by the user who wrote them, readable by them alone.
// Bytes the client never wrote read as zeros there (a sparse file of the
// file's size as the client saw it).
func (w *Files) conflictCopy(sf *sfile, name string) (string, error) {
	server := strings.NewReplacer("/", "_", ":", "_").Replace(w.Where)
	rel := name
	if rel == "" {
		rel = fmt.Sprintf("qid-%d", sf.tok.Ino)
	}
	p := filepath.Join(w.LostDir, server, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
	p += "." + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.MkdirAll(filepath.Dir(p), 0o711); err != nil {
		return "", err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	for _, x := range sf.d.ext {
		if _, err = f.WriteAt(x.data, x.off); err != nil {
			break
		}
	}
	if err == nil {
		err = f.Truncate(sf.d.size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && os.Geteuid() == 0 {
		err = os.Chown(p, int(session.UID(sf.uid)), -1)
	}
	if err != nil {
		os.Remove(p)
		return "", err
	}
	return p, nil
}
