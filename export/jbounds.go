package export

import (
	"cmp"
	"slices"
	"syscall"
	"time"

	"github.com/shalefs/shale/journal"
)

// The journals' memory, bounded whatever clients do: their number
// (MaxJournals), each one's bytes (JournalBytes: its queued records and
// its interest set), and all of theirs (JournalMemory). Overflow never
// costs more memory: it becomes the protocol's Reset, after which the
// client drops what it cached and the journal holds one record and no
// interest. Journals without a connection (abandoned, maybe for good) go
// first and sooner: past MaxJournals the longest abandoned are deleted,
// and when abandoned journals hold more than an eighth of JournalMemory,
// the largest of them are Reset, down to half of that share. Connected
// journals are Reset, largest first, only when all of them together pass
// JournalMemory.
//
// Sizes are estimates of what the records and the interest map hold in
// memory (a record's fields are shared by the journals it goes to, but
// each is charged as if its own: the bound errs on the safe side).

// Defaults of the journals' bounds (Options).
const (
	defaultMaxJournals   = 4096
	defaultJournalBytes  = 16 << 20
	defaultJournalMemory = 128 << 20
)

// Estimated bytes: a record in a queue, a field of one, an interest entry.
const (
	recordCost   = 64
	fieldCost    = 72
	interestCost = 40
)

func recCost(r *journal.Record) int64 {
	n := int64(recordCost)
	for i := range r.Fields {
		n += fieldCost + int64(len(r.Fields[i].Name)+len(r.Fields[i].Raw))
	}
	return n
}

// growLocked charges d bytes to j (j.mu held), and to the controller's
// totals.
func (j *jrnl) growLocked(d int64) {
	if d == 0 {
		return
	}
	j.bytes += d
	if j.deleted {
		return // out of the totals (deleteLocked)
	}
	j.ctl.bytes.Add(d)
	if j.conns == 0 {
		j.ctl.idleBytes.Add(d)
	}
}

// fitsLocked tells whether j may grow by d within JournalBytes.
func (j *jrnl) fitsLocked(d int64) bool { return j.bytes+d <= j.ctl.maxBytes }

// over tells whether the journals' totals need trimming: a cheap check
// for every change.
func (ctl *controller) over() bool {
	return ctl.idleBytes.Load() > ctl.maxMemory/8 || ctl.bytes.Load() > ctl.maxMemory
}

// trim brings the journals back within their bounds.
func (ctl *controller) trim() {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	ctl.trimLocked(0)
}

// trimLocked trims, leaving room for that many more journals.
func (ctl *controller) trimLocked(room int) {
	if len(ctl.journals)+room <= ctl.maxJournals && !ctl.over() {
		return
	}
	type sized struct {
		j     *jrnl
		bytes int64
		gone  time.Time
		idle  bool
	}
	all := make([]sized, 0, len(ctl.journals))
	for _, j := range ctl.journals {
		j.mu.Lock()
		all = append(all, sized{j, j.bytes, j.gone, j.conns == 0})
		j.mu.Unlock()
	}
	// Past the count, the longest abandoned go.
	if excess := len(ctl.journals) + room - ctl.maxJournals; excess > 0 {
		slices.SortFunc(all, func(a, b sized) int { return a.gone.Compare(b.gone) })
		for i := range all {
			if excess == 0 {
				break
			}
			if all[i].idle {
				ctl.deleteLocked(all[i].j)
				all[i].idle, all[i].bytes = false, 0
				all[i].j = nil
				excess--
			}
		}
	}
	slices.SortFunc(all, func(a, b sized) int { return cmp.Compare(b.bytes, a.bytes) })
	if ctl.idleBytes.Load() > ctl.maxMemory/8 {
		for _, x := range all {
			if ctl.idleBytes.Load() <= ctl.maxMemory/16 {
				break
			}
			if x.j != nil && x.idle {
				x.j.reset()
			}
		}
	}
	for _, x := range all {
		if ctl.bytes.Load() <= ctl.maxMemory {
			break
		}
		if x.j != nil {
			x.j.reset()
		}
	}
}

// deleteLocked deletes j (ctl.mu held): its client's next Tlcreate makes
// a new one, which tells it to drop everything.
func (ctl *controller) deleteLocked(j *jrnl) {
	j.mu.Lock()
	j.deleted = true
	ctl.queued.Add(-int64(len(j.recs)))
	j.recs = nil
	j.interest = map[interestKey]uint8{}
	ctl.bytes.Add(-j.bytes)
	if j.conns == 0 {
		ctl.idleBytes.Add(-j.bytes)
	}
	j.bytes = 0
	j.mu.Unlock()
	delete(ctl.journals, j.name)
	ctl.list = nil
}

// reset replaces j's queue by one Reset, unless it is that already.
func (j *jrnl) reset() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.recs) == 1 && j.recs[0].Kind == journal.Reset && len(j.interest) == 0 {
		return
	}
	j.resetLocked()
}

// room makes room for one more journal: ENOSPC if every one is connected.
func (ctl *controller) roomLocked() syscall.Errno {
	ctl.trimLocked(1)
	if len(ctl.journals) >= ctl.maxJournals {
		return syscall.ENOSPC
	}
	return 0
}
