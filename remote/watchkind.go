package remote

// What an entry record means to a watch. The controller says only that a
// name in a directory changed (journal.EntryChanged: telling added from
// removed would cost it a lookup under the raiser's locks), so the watch
// looks the name up and compares it with what it knew: a new name is a
// create, a name gone a delete, and a name gone whose file shows up under
// another name soon after (the same QID) a rename, as inotify pairs
// IN_MOVED_FROM and IN_MOVED_TO.

import "time"

// renameWait is how long a delete waits for the create of the same file
// that makes it a rename: the controller sends the two halves of a
// rename, old name first, one record each, at once. A delete is reported
// that much late.
const renameWait = 100 * time.Millisecond

// entry reports what became of the name p.
func (w *watcher) entry(p string) {
	w.mu.Lock()
	old, known := w.qids[p]
	w.mu.Unlock()
	at, a, err := w.walk(p)
	if err != nil {
		if known {
			w.gone(p, old)
		}
		return // or it came and went before we looked
	}
	q := at.Token().Ino
	switch {
	case !known:
		w.register(at, p, &a)
		w.came(p, q)
	case q != old:
		// Another file under the name: the old one is gone, or moved.
		w.gone(p, old)
		w.register(at, p, &a)
		w.came(p, q)
	default:
		// The same file under the same name (a link count, a rename
		// onto itself): the entry changed, nothing more to say.
		w.report(Change{Event: "change", Path: p})
	}
}

// gone forgets p, file q, and reports its delete unless q comes back
// under another name within renameWait.
func (w *watcher) gone(p string, q uint64) {
	w.mu.Lock()
	delete(w.qids, p)
	if w.paths[q] == p {
		delete(w.paths, q)
	}
	prev, held := w.pending[q]
	w.pending[q] = p
	w.mu.Unlock()
	if held {
		w.report(Change{Event: "delete", Path: prev}) // two of its names went
	}
	time.AfterFunc(renameWait, func() {
		w.mu.Lock()
		still := w.pending[q] == p && w.ctx.Err() == nil
		if w.pending[q] == p {
			delete(w.pending, q)
		}
		w.mu.Unlock()
		if still {
			w.report(Change{Event: "delete", Path: p})
		}
	})
}

// came reports p, file q: a rename if q's old name has just gone.
func (w *watcher) came(p string, q uint64) {
	w.mu.Lock()
	old, moved := w.pending[q]
	delete(w.pending, q)
	w.mu.Unlock()
	if moved {
		w.report(Change{Event: "rename", Path: p, Old: old})
		return
	}
	w.report(Change{Event: "create", Path: p})
}

// report passes c to Watch's caller, one change at a time.
func (w *watcher) report(c Change) {
	w.out.Lock()
	defer w.out.Unlock()
	w.tell(c)
}
