// Package fuseview serves any node of a shale stack as a FUSE mount, on
// go-fuse's fs package. One process may serve several mounts.
//
// As root it mounts with allow_other and default_permissions, so that the
// kernel checks every user's permissions against the attributes of the
// lower file system, exactly as there. Data of files whose handles are
// host files goes through FUSE passthrough when the kernel offers it.
package fuseview

import (
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/coherence"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Options tune a view.
type Options struct {
	// Timeout is how long the kernel may cache names and attributes.
	// Changes made through the view are never stale (the kernel updates
	// its caches from our replies); the timeout bounds how long a change
	// made beneath the view by someone else can go unseen.
	Timeout time.Duration
	// AllowOther lets every user use the mount, with the kernel checking
	// permissions (default_permissions). Needs root.
	AllowOther bool
	// Passthrough lets the kernel do data I/O on host files directly.
	Passthrough bool
	// Source is shown as the mount's source in /proc/mounts and df.
	Source string
	// Debug logs every FUSE request.
	Debug bool
	// Coherent registers the view with its stack's manager: it drops the
	// kernel's caches when other views or programs beside the stack change
	// files.
	Coherent bool
	// MountFlags are mount(2) flags (MS_RDONLY, MS_NOSUID, ...); 0 gives
	// go-fuse's MS_NOSUID|MS_NODEV.
	MountFlags uintptr
	// NoPollHack skips go-fuse's poll hack at mount, which opens a file of
	// the new mount from this process so that the kernel learns at once
	// that polling is not supported. Only a process that polls files of
	// its own mounts needs it (in-process tests do, through Go's
	// netpoller); a server killed in the middle of it hangs the mount.
	NoPollHack bool
	// KeepCache keeps the page cache across opens (safe when Coherent).
	KeepCache bool
	// Counters, if set, count the view's requests and invalidations
	// (stats.go); views may share them. Nil: the view counts for itself.
	Counters *Counters
	// Denied, if set, is told of each request answered EACCES or EPERM,
	// with its opcode and the caller's uid, in the request's goroutine:
	// to explain what the kernel cannot (a server's root squash).
	Denied func(op string, uid uint32)
}

// view is one mount.
type view struct {
	opts Options
	raw  *rawFS
	id   uint32 // in the coherence manager
	mgr  *coherence.Manager

	// sameOffsets: the view's files have the offsets of the host's (no
	// layer in the stack reshapes data), so Data events' ranges apply.
	sameOffsets bool

	cached coherence.Held[*inode] // the inodes the kernel holds (holder.go)
	makers makers                 // requests that may revive an inode (forget.go)
	ctr    *Counters
}

// Mount mounts root, a node of st, at dir and starts serving it. The
// returned server's Wait returns when the mount goes away. root remains
// the caller's: the view never calls its Forget, so several views may
// serve one root.
func Mount(dir string, st *stack.Stack, root layer.Node, o Options) (*fuse.Server, error) {
	_, server, err := mount(dir, st, root, o)
	return server, err
}

// mount is Mount, and gives the view too (for tests).
func mount(dir string, st *stack.Stack, root layer.Node, o Options) (*view, *fuse.Server, error) {
	v := &view{opts: o, ctr: o.Counters}
	if v.ctr == nil {
		v.ctr = new(Counters)
	}
	var m *coherence.Manager
	if o.Coherent {
		m = st.Manager()
		v.id = m.Register(v, root)
		v.mgr = m
	}
	if r, ok := root.(layer.OffsetKeeper); ok {
		v.sameOffsets = r.KeepsOffsets()
	}
	tok := root.Token()
	mo := fuse.MountOptions{
		AllowOther:       o.AllowOther,
		FsName:           o.Source,
		Name:             "shale",
		DirectMount:      true,
		DirectMountFlags: o.MountFlags,
		MaxWrite:         1 << 20,
		MaxReadAhead:     1 << 20,
		Debug:            o.Debug,
		EnableLocks:      true,
		// Symlinks never change in place, so caching them is safe; the
		// kernel decides when a listing is worth READDIRPLUS.
		EnableSymlinkCaching: true,
		// Atomic O_TRUNC: node.go (truncate) says why.
		ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO | fuse.CAP_ATOMIC_O_TRUNC,
	}
	if o.AllowOther {
		mo.Options = append(mo.Options, "default_permissions")
		// With POSIX ACLs the kernel checks the lower file system's ACLs
		// too, and leaves the umask to us (DONT_MASK): hostfs applies it,
		// or the directory's default ACL, as the lower file system would.
		// Without, the kernel masks every new mode with the umask before
		// we see it, which a default ACL on LOWER would have replaced.
		mo.EnableAcl = true
		mo.ExtraCapabilities |= fuse.CAP_DONT_MASK
	}
	// The kernel keeps negative entries as long as names: a coherent view
	// drops those a change names (negative.go).
	negative := o.Timeout
	fo := &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    &o.Timeout,
		AttrTimeout:     &o.Timeout,
		NegativeTimeout: &negative,
		NullPermissions: true,
		RootStableAttr:  &fs.StableAttr{Ino: tok.Ino, Gen: tok.Gen},
	}
	if o.Debug {
		fo.Logger = log.New(os.Stderr, "", log.Lmicroseconds)
	}
	// The root stays the caller's: several views may share it.
	rootInode := v.newInode(root)
	rootInode.h.done.Store(true)
	// No OPENDIR (opendir.go) where a listing can go on in a new stream.
	ds, ok := root.(layer.DirSeeker)
	noOpendir := o.KeepCache && o.AllowOther && ok && ds.SeeksAnywhere()
	v.raw = &rawFS{RawFileSystem: fs.NewNodeFS(rootInode, fo), makers: &v.makers, noOpendir: noOpendir}
	v.hold(rootInode)
	server, err := fuse.NewServer(&counting{v.raw, v.ctr, o.Denied}, dir, &fo.MountOptions)
	if err == nil {
		go server.Serve()
		// NewServer returns once mounted; WaitMount adds only the poll
		// hack.
		if !o.NoPollHack {
			err = server.WaitMount()
		}
	}
	if err != nil {
		if m != nil {
			m.Unregister(v.id)
		}
		return nil, nil, err
	}
	if m != nil {
		go func() {
			server.Wait()
			m.Unregister(v.id)
		}()
	}
	raiseReadahead(dir, mo.MaxReadAhead)
	return v, server, nil
}

// raiseReadahead lets the kernel read ahead as far as MaxReadAhead: FUSE
// starts a mount's backing device at 128 KiB, which go-fuse can only lower,
// so READs would stay at 128 KiB. Needs root; without it reads stay small.
func raiseReadahead(dir string, bytes int) {
	// The device comes from mountinfo, not a stat of dir: a request to our
	// own mount would hang the process, were it killed before the reply.
	if dev, ok := mountDevice(dir); ok {
		os.WriteFile("/sys/class/bdi/"+dev+"/read_ahead_kb", []byte(strconv.Itoa(bytes>>10)), 0)
	}
}

// mountDevice returns the "major:minor" of the file system mounted last at
// dir.
func mountDevice(dir string) (dev string, ok bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	// id parent major:minor root mountpoint ...; mountinfo escapes space,
	// tab, newline and backslash in octal.
	esc := strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`).Replace(dir)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == esc {
			dev, ok = f[2], true
		}
	}
	return dev, ok
}
