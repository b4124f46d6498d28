package fuseview

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

// A view is a coherence holder: the kernel caches the attributes, pages
// and names of the inodes it knows (view.cached), and the view invalidates
// them when another view, or a program beside the stack, changes the file.

// Invalidate drops what the kernel caches about ev's file, before it
// returns unless a request of this view is at work on the file (busy).
//
// A change made beside the stack first waits for this view's READs of
// the file in flight. The kernel sized the file by what such a READ
// returns only if no invalidation came between its sending and its
// reply: a short READ answered after the change (a truncation's) would
// otherwise leave the old size over a page padded with zeros, which
// programs read as data. The raisers of such changes (watchers, a remote
// journal, an open's version check) hold no lock a READ may need; a
// change made by another view's request may, so that one does not wait.
func (v *view) Invalidate(ev layer.Event) {
	v.ctr.callbacks.Add(1)
	if ev.Kind == layer.Everything {
		go v.invalidateAll()
		return
	}
	busy := v.cached.IsBusy(ev.Token)
	if !busy && ev.View == 0 {
		v.cached.WaitReads(ev.Token)
	}
	told := false
	for _, in := range v.cached.Of(ev.Token) {
		// A LOOKUP's new inode counts as forgotten until go-fuse links
		// it, after the reply is made.
		if in.Forgotten() {
			continue
		}
		told = true
		if busy {
			go v.invalidate(in, ev)
		} else {
			v.invalidate(in, ev)
		}
	}
	if !told {
		v.cached.Missed(ev.Token) // a LOOKUP in flight may be finding it
	}
}

func (v *view) invalidate(in *inode, ev layer.Event) {
	switch ev.Kind {
	case layer.Data:
		// The attributes, and the pages the change touched; a layer that
		// reshapes files makes its offsets meaningless here, so all pages.
		off, n := ev.Off, ev.Len
		if !v.sameOffsets {
			off, n = 0, 0
		}
		in.notifyContent(off, n)
		v.ctr.invalidated(invalPages)
	case layer.Attrs:
		in.notifyContent(-1, 0) // attributes only
		v.ctr.invalidated(invalAttrs)
	case layer.Entries:
		// The directory's size, times and links, and its listing.
		in.listed.Store(false)
		in.notifyContent(0, 0)
		v.ctr.invalidated(invalPages)
		v.invalidateName(in, ev.Name)
	}
}

// notifyContent drops the kernel's attributes of in, and its pages in
// [off, off+n) (none for a negative off). An inode made by a LOOKUP whose
// reply the kernel has not read yet is unknown to it: told again until
// it knows it, else it would keep what the LOOKUP found before the
// change.
func (in *inode) notifyContent(off, n int64) {
	if e := in.NotifyContent(off, n); e == 0 || e == syscall.ENOSYS || time.Since(in.born) > time.Second {
		return
	}
	go func() {
		for d := time.Millisecond; d < 4*time.Second; d *= 2 {
			time.Sleep(d)
			if e := in.NotifyContent(off, n); e == 0 || in.Forgotten() {
				return
			}
		}
	}()
}

// invalidateAll drops every attribute, page and entry the kernel holds of
// this view, when changes were lost.
func (v *view) invalidateAll() {
	v.ctr.invalidated(invalAll)
	for _, in := range v.cached.All() {
		if in.Forgotten() {
			continue
		}
		in.NotifyContent(0, 0)
		in.notifyEntries()
	}
}

// invalidateName drops the kernel's entry for the name that ev's lower
// name has in this view. A name the layers cannot translate (their own
// files) costs every cached entry of the directory.
func (v *view) invalidateName(dir *inode, lower string) {
	name, ok := lower, true
	if t, is := dir.node().(layer.NameTranslator); is {
		name, ok = t.UpperName(context.Background(), lower)
	}
	if ok {
		// Only names the kernel holds, positive or negative.
		neg := dir.neg.changed(name)
		if neg {
			v.ctr.negDropped.Add(1)
		}
		if neg || dir.GetChild(name) != nil {
			dir.NotifyEntry(name)
			v.ctr.invalidated(invalEntry)
		}
		return
	}
	dir.notifyEntries()
}

// notifyEntries drops every entry the kernel holds in dir, positive or
// negative.
func (dir *inode) notifyEntries() {
	ctr := dir.v.ctr
	for name := range dir.Children() {
		dir.NotifyEntry(name)
		ctr.invalidated(invalEntry)
	}
	for _, name := range dir.neg.all() {
		dir.NotifyEntry(name)
		ctr.invalidated(invalEntry)
		ctr.negDropped.Add(1)
	}
}

// openFlags are the FUSE open flags of a file opened as h: with coherence
// the page cache stays valid across opens, since changes are pushed. A
// file write-shared with another machine is opened for direct I/O, which
// the kernel maps only privately: a shared mapping of it fails (ENODEV)
// rather than diverge from the other machine's (layer.WriteShared).
func (v *view) openFlags(h layer.Handle) uint32 {
	if layer.IsWriteShared(h) {
		return fuse.FOPEN_DIRECT_IO
	}
	if v.opts.KeepCache {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}
