package fuseview

import (
	"context"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shalefs/shale/layer"
)

// A view is a coherence holder: the kernel caches the attributes, pages
// and names of the inodes it knows, and the view invalidates them when
// another view, or a program beside the stack, changes the file.

// known records in under its token. A token may have several inodes for
// a moment: go-fuse discards a new inode for a file it already knows
// (hard links, racing lookups), and a discarded one is never forgotten, so
// the list drops inodes the kernel does not hold.
func (v *view) known(in *inode) {
	tok := in.node().Token()
	v.mu.Lock()
	defer v.mu.Unlock()
	ins := v.byToken[tok][:0:0]
	for _, o := range v.byToken[tok] {
		if !o.Forgotten() {
			ins = append(ins, o)
		}
	}
	v.byToken[tok] = append(ins, in)
}

func (v *view) forgotten(in *inode) {
	tok := in.node().Token()
	v.mu.Lock()
	defer v.mu.Unlock()
	ins := v.byToken[tok]
	for i, o := range ins {
		if o == in {
			ins = append(ins[:i:i], ins[i+1:]...)
			break
		}
	}
	if len(ins) == 0 {
		delete(v.byToken, tok)
	} else {
		v.byToken[tok] = ins
	}
}

func (v *view) inodes(tok layer.Token) []*inode {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]*inode(nil), v.byToken[tok]...)
}

// busy marks a request of this view at work on tok until the returned
// function runs. While it is, the kernel may hold locks of tok's inode
// (its pages during a WRITE, a directory's lock during a create) until we
// reply, so an invalidation of tok must not be waited for: if that request
// is itself waiting to invalidate another view where our own requester
// holds the locks, neither could go on.
func (v *view) busy(tok layer.Token) func() {
	v.mu.Lock()
	v.inflight[tok]++
	v.mu.Unlock()
	return func() {
		v.mu.Lock()
		if v.inflight[tok]--; v.inflight[tok] == 0 {
			delete(v.inflight, tok)
		}
		v.mu.Unlock()
	}
}

// Invalidate drops what the kernel caches about ev's file, before it
// returns unless a request of this view is at work on the file (busy).
func (v *view) Invalidate(ev layer.Event) {
	if ev.Kind == layer.Everything {
		go v.invalidateAll()
		return
	}
	v.mu.Lock()
	busy := v.inflight[ev.Token] > 0
	v.mu.Unlock()
	for _, in := range v.inodes(ev.Token) {
		if in.Forgotten() {
			continue
		}
		if busy {
			go v.invalidate(in, ev)
		} else {
			v.invalidate(in, ev)
		}
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
		in.NotifyContent(off, n)
	case layer.Attrs:
		in.NotifyContent(-1, 0) // attributes only
	case layer.Entries:
		in.NotifyContent(-1, 0) // the directory's size, times, links
		v.invalidateName(in, ev.Name)
	}
}

// invalidateAll drops every attribute, page and entry the kernel holds of
// this view, when changes were lost.
func (v *view) invalidateAll() {
	v.mu.Lock()
	var all []*inode
	for _, ins := range v.byToken {
		all = append(all, ins...)
	}
	v.mu.Unlock()
	for _, in := range all {
		if in.Forgotten() {
			continue
		}
		in.NotifyContent(0, 0)
		for name := range in.Children() {
			in.NotifyEntry(name)
		}
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
		// Only names the kernel holds: it keeps no negative entries
		// when a manager pushes changes.
		if dir.GetChild(name) != nil {
			dir.NotifyEntry(name)
		}
		return
	}
	for name := range dir.Children() {
		dir.NotifyEntry(name)
	}
}

// openFlags are the FUSE open flags of a file: with coherence the page
// cache stays valid across opens, since changes are pushed.
func (v *view) openFlags() uint32 {
	if v.opts.KeepCache {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}
