package writeback

import (
	"slices"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Attributes of delayed data, for the other clients (journal.Follow,
// issue 23): a client that holds delayed writes of a file another client
// follows tells the server the file's size and mtime as it has them when
// asked, and again before each close of the file returns, so that a stat
// on the other client after the close shows them. The server answers that
// Held once the others' journals have dropped what they had.

// Follow takes the server's Follow of the file numbered tok.Ino: it is
// followed until this client forgets it. The Held it asks for is sent in
// the background: it may wait for a write-back of the file.
func (w *Files) Follow(tok layer.Token) {
	// A number a new file reuses is two files (an unlink and a create):
	// the one with delayed writes answers. One is made if need be: a
	// Follow comes during the open that would make it.
	w.smu.Lock()
	w.followed[tok.Ino] = true
	sfs := slices.Clone(w.sfiles[tok.Ino])
	w.smu.Unlock()
	if len(sfs) == 0 && tok.Gen != 0 {
		sfs = append(sfs, w.sfileOf(tok, true)) // so followed stays
	}
	for _, sf := range sfs {
		sf.followed.Store(true)
	}
	go w.sendHeld(tok.Ino, layer.Token{})
}

// Closing is told of each close of tok's file (close(2), not the
// release) through a handle that may write: a followed file's delayed
// writes (or that it has none left: a truncation) are told to the
// server before it returns. Writing through, there is nothing to tell.
func (w *Files) Closing(tok layer.Token, write bool) {
	if !write || !w.Delaying() {
		return
	}
	sf := w.sfileOf(tok, false)
	if sf == nil || !sf.followed.Load() || !sf.hasDirty.Load() && !sf.toldHeld.Load() {
		return // nothing delayed now, nor told before
	}
	w.sendHeld(tok.Ino, tok)
}

// sendHeld sends Held of path: the size and mtime of own's file (a
// close's), or else (own zero: a Follow's) of the one of path's files
// with delayed writes; or none. One at a time per QID path, each
// made and sent after the last was answered, so that an older one never
// lands last: the Held a Follow asked for of a file an unlink and create
// had just replaced, made from the old file's state, once landed after
// the new file's close told its size, and the server showed the new
// file as empty.
func (w *Files) sendHeld(path uint64, own layer.Token) {
	if w.Send == nil {
		return
	}
	defer w.helds.lock(path)()
	r := journal.Record{Kind: journal.Held, Qid: p9wire.Qid{Type: p9wire.QTFile, Path: path}}
	for _, sf := range w.sfilesOf(path) {
		if own.Gen != 0 && sf.tok != own {
			continue // the removed file's: the close speaks of its own
		}
		sf.mu.Lock()
		if d := sf.d; d != nil {
			r.Fields = []journal.Field{journal.HeldField(uint64(d.size), d.mtime)}
		}
		sf.toldHeld.Store(sf.d != nil)
		sf.mu.Unlock()
	}
	w.Send(r)
	w.Ctr.Helds.Add(1)
}
