package writeback

import (
	"context"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Read delegations (journal.Delegated, in an open's answer: Opened;
// the server's side is export's sprite_deleg.go): while this client
// holds one of a file and is
// connected, an open of it for reading needs no request (the remote
// node opens it on the server only if a read misses the cache). Such a
// handle is one of sf.handles like any: a Return opens each on the
// server before it is answered, so that the server then sees every open
// this client has of the file.

// OpenDelegated registers h, an open for reading of tok's file, without
// a request, if this client holds a delegation of it; false if not.
func (w *Files) OpenDelegated(tok layer.Token, h Writer) bool {
	sf := w.sfileOf(tok, false)
	if sf == nil || !w.Session.Live() {
		return false
	}
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	if !sf.deleg || sf.gone || sf.uncached.Load() {
		return false
	}
	if sf.handles == nil {
		sf.handles = map[Writer]bool{}
	}
	sf.handles[h] = false
	w.Ctr.OpensDelegated.Add(1)
	return true
}

// Delegated tells whether this client holds a delegation of tok's file
// now (and is connected).
func (w *Files) Delegated(tok layer.Token) bool {
	sf := w.sfileOf(tok, false)
	if sf == nil || !w.Session.Live() {
		return false
	}
	sf.vmu.Lock()
	defer sf.vmu.Unlock()
	return sf.deleg && !sf.gone && !sf.uncached.Load()
}

// Return answers a Return of path (record seq): the delegation goes,
// each handle of the file opens on the server, then pushes (the locks
// kept under it go to the server: remote's keptlocks.go), then Returned
// says so. Not on the journal's reader: it takes requests, and the
// server answers those opens once this client's journal has applied
// what it queued.
func (w *Files) Return(path, seq uint64, push func(path uint64)) {
	var hs []Writer
	for _, sf := range w.sfilesOf(path) {
		sf.vmu.Lock()
		sf.deleg = false
		sf.uncaches++ // an open's answer it crossed grants nothing
		for h := range sf.handles {
			hs = append(hs, h)
		}
		sf.vmu.Unlock()
	}
	for _, h := range hs {
		h.Hold(context.Background())
	}
	push(path)
	w.Ctr.Returns.Add(1)
	w.Send(journal.Record{Kind: journal.Returned, Seq: seq, Qid: p9wire.Qid{Path: path}})
}

// Undelegate drops this client's delegations of path (0: of every
// file): the server's journal told of a change it did not take them
// back for (one made beside it), or everything was dropped.
func (w *Files) Undelegate(path uint64) {
	var sfs []*sfile
	if path != 0 {
		sfs = w.sfilesOf(path)
	} else {
		w.smu.Lock()
		for _, l := range w.sfiles {
			sfs = append(sfs, l...)
		}
		w.smu.Unlock()
	}
	for _, sf := range sfs {
		sf.vmu.Lock()
		sf.deleg = false
		sf.vmu.Unlock()
	}
}
