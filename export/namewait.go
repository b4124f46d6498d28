package export

import (
	"context"
	"syscall"
	"time"

	"github.com/shalefs/shale/p9wire"
)

// Name changes reach the other clients before they return (issue 23): a
// stat on client B of a name client A just renamed into place, removed or
// made finds B's kernel holding the old entry and its attributes, which
// it asks nobody about until B's journal applies the change's record.
// So a request that changes names is answered once every other client's
// journal that got a record from it has applied it: a round trip to
// those clients (only those that cache the directory), as a write to a
// write-shared file waits. A client that lets such a wait time out is
// not waited for again until it has applied what it was late with: a
// stalled client costs others one wait, not one a change.

// defaultNameWait bounds the wait (Options.NameWait): a name change is
// not worth an open's wait.
const defaultNameWait = time.Second

// waitingNames wraps the handler of a request that changes names.
func waitingNames(h handler) handler {
	return func(c *conn, ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
		if c.s.ctl.nameWait < 0 || c.onJournal(d) {
			return h(c, ctx, d) // a journal's Tlcreate: no one's names
		}
		marks := c.s.ctl.marks(c.journal.Load())
		m, e := h(c, ctx, d)
		if e == 0 {
			c.s.ctl.waitMarks(ctx, marks)
		}
		return m, e
	}
}

// onJournal tells whether the request in d is on a fid of the journal
// tree (its first field names the fid it acts on).
func (c *conn) onJournal(d *p9wire.Dec) bool {
	var head p9wire.FidReq
	head.Decode(&p9wire.Dec{B: d.B})
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.fids[head.Fid]
	if f == nil {
		return false
	}
	_, ok := f.is.(*journalFid)
	return ok
}

// jmark is a journal's newest seq before a request.
type jmark struct {
	j    *jrnl
	last uint64
}

// marks is the newest seq of every journal but own that is read now and
// not late.
func (ctl *controller) marks(own *jrnl) []jmark {
	js := ctl.others(own)
	ms := make([]jmark, 0, len(js))
	for _, j := range js {
		j.mu.Lock()
		if j.conns > 0 && !j.deleted && j.base >= j.late {
			ms = append(ms, jmark{j, j.last})
		}
		j.mu.Unlock()
	}
	return ms
}

// waitMarks waits until the journals given records since marks were
// taken have applied them, up to ctl.nameWait in all.
func (ctl *controller) waitMarks(ctx context.Context, ms []jmark) {
	var deadline *time.Timer
	expired := false
	for _, m := range ms {
		m.j.mu.Lock()
		moved := m.j.last > m.last
		m.j.mu.Unlock()
		if !moved {
			continue
		}
		if deadline == nil {
			deadline = time.NewTimer(ctl.nameWait)
			defer deadline.Stop()
		}
		if !expired && m.j.waitApplied(ctx, deadline.C) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		expired = true
		m.j.gaveUp()
	}
}
