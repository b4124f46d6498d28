package shard

import (
	"context"
	"strings"

	"github.com/shalefs/shale/layer"
)

// Events. Shard keeps the tokens of the layer beneath: a file in a bucket
// is the file users see, and a managed directory is the directory beneath.
// Only buckets have no counterpart above, so their events are translated,
// UCLA-style, into their directory's: an entry changed in a bucket is an
// entry changed in the managed directory, carried as "bucket/name" so that
// the directory's UpperName can ask that bucket for the name (the layers
// beneath may encode names per directory); a bucket's own attributes show
// only in the link count shard computes for the directory, which the
// entry events already make holders fetch again.

// bucketRef is where a cached bucket node belongs.
type bucketRef struct {
	st *dirState
	b  int
}

// Translate gives the events that ev, as the layers beneath translate it,
// means in this layer.
func (n *node) Translate(ev layer.Event) []layer.Event {
	evs := n.PassThrough.Translate(ev)
	out := make([]layer.Event, 0, len(evs))
	for _, e := range evs {
		if e, ok := n.fs.fold(e); ok {
			out = append(out, e)
		}
	}
	return out
}

// fold moves an event about a bucket onto its managed directory, or drops
// it (ok=false) if nothing above shows it. It takes only locks under
// which the layer changes nothing beneath, so raises no event (fs.mu, a
// state's mu, bmu), never fs.conv, which the raiser may hold.
func (f *fs) fold(ev layer.Event) (layer.Event, bool) {
	if ev.Kind == layer.Everything {
		f.forgetSubdirs()
		return ev, true
	}
	f.bmu.Lock()
	r, ok := f.byBucket[ev.Token]
	f.bmu.Unlock()
	if !ok {
		return ev, true
	}
	// The bucket's directories may have changed (made, removed, moved
	// beside shale): the directory's link count is counted again.
	r.st.subdirsChanged(r.b)
	if ev.Kind != layer.Entries {
		return ev, false
	}
	ev.Token = r.st.tok
	ev.Name = bucketName(r.b) + "/" + ev.Name
	return ev, true
}

// forgetSubdirs has every bucket's directories counted again, after
// events were lost.
func (f *fs) forgetSubdirs() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, st := range f.dirs {
		st.mu.Lock()
		if st.t != nil {
			for b := range st.t.subdirs {
				st.t.subdirs[b] = -1
			}
		}
		st.mu.Unlock()
	}
}

// UpperName maps the name of an entry event about directory n (see
// layer.Event) to the name users see: "bucket/name", from Translate, is
// name in that bucket; any other is a name in the directory beneath. A
// bucket's own name maps to itself, which no entry above has, so holders
// drop nothing for it. Names the layers beneath do not change need no
// bucket node: only those that do (crypt, whose names depend on their
// directory) need one.
func (n *node) UpperName(ctx context.Context, name string) (string, bool) {
	bucket, inBucket, isPath := strings.Cut(name, "/")
	below, ok := n.Lower.(layer.NameTranslator)
	switch {
	case !isPath && !ok:
		return name, true
	case !isPath:
		return below.UpperName(ctx, name)
	}
	b, isBucket := bucketIndex(bucket)
	if !isBucket {
		return "", false
	}
	if !ok {
		return inBucket, true
	}
	d, ok := n.fs.cachedBucket(n.Lower.Token(), b).(layer.NameTranslator)
	if !ok {
		return "", false // dropped since: the holder drops every name
	}
	return d.UpperName(ctx, inBucket)
}

// cachedBucket gives the node of bucket b of the managed directory with
// token tok if the layer caches it, else nil. It does not look the bucket
// up: UpperName runs while the raiser may hold fs.conv.
func (f *fs) cachedBucket(tok layer.Token, b int) layer.Node {
	st := f.loaded(tok)
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.t == nil {
		return nil
	}
	return st.t.nodes[b]
}
