package remote

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"github.com/shalefs/shale/remote/writeback"
)

// jreader reads the client's journal (package journal has the protocol):
// on every new connection, before anything else is asked on it, it opens
// the journal, and keeps one read of it outstanding, applying the records
// to the cache and raising them as the stack's events, so that views
// above drop what the kernel holds too.
type jreader struct {
	fs *FS

	mu        sync.Mutex // serializes applying: an old connection's last reply and a new one's
	uuid      string
	epoch     uint64        // 0: none seen yet
	seq       uint64        // the last applied
	warned    bool          // the fallback was logged
	cur       *session.Conn // the connection whose journal is read
	fid       uint32        // cur's fid of the journal, open
	onRecord  func(r *journal.Record, events []layer.Event)
	flushWait time.Duration
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (j *jreader) id() string {
	if j == nil {
		return ""
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.uuid
}

// open opens the journal on c, a new connection, and starts reading it.
// Without a controller the client goes on without a cache. An error is a
// connection lost meanwhile.
func (j *jreader) open(c *session.Conn) error {
	fs := j.fs
	root := c.NewFid()
	uid := uint32(os.Geteuid())
	rq, err := c.AttachQid(root, uid, journal.Aname)
	if err != nil {
		if errors.Is(err, session.ErrLost) {
			return err
		}
		j.fallback(fmt.Sprintf("attach %s: %v", journal.Aname, session.Errno(err)))
		return nil
	}
	c.SetCaps(rq.Vers)
	// root is not clunked: it goes with the connection, and a clunk is
	// one more request on every (re)start.
	j.mu.Lock()
	uuid := j.uuid
	j.mu.Unlock()
	created := false
	var q p9wire.Qid
	fid, _, err := c.Walk(root, []string{uuid})
	if err == nil {
		q, _, err = c.Lopen(fid, p9wire.WireFlags(unix.O_RDWR))
		if err != nil {
			c.Clunk(fid)
		}
	} else if errors.Is(err, syscall.ENOENT) {
		// Tlcreate makes the fid it is given the new open file.
		fid, _, err = c.Walk(root, nil)
		if err == nil {
			r := p9wire.OpenReply{T: p9wire.Tlcreate}
			err = c.RPC(&p9wire.Lcreate{Fid: fid, Name: uuid, Flags: p9wire.WireFlags(unix.O_RDWR), Mode: 0o600, Gid: uint32(os.Getegid())}, &r)
			if err != nil {
				c.Clunk(fid)
			}
			q, created = r.Qid, true
		}
	}
	if err != nil {
		if errors.Is(err, session.ErrLost) {
			return err
		}
		j.fallback(fmt.Sprintf("open journal %s: %v", uuid, session.Errno(err)))
		return nil
	}
	if created {
		// The controller knows nothing of what we hold.
		j.mu.Lock()
		j.epoch, j.seq = 0, 0
		j.mu.Unlock()
		j.dropAll()
	}
	fs.controller.Store(true)
	// Sprite's rules: what this client holds dirty goes first, before
	// any open can ask for it (remote/writeback).
	sprite := q.Vers == journal.Sprite
	fs.wb.SetSprite(sprite)
	if sprite {
		if err := fs.wb.Reclaim(c, fid); err != nil {
			return err
		}
	}
	j.mu.Lock()
	j.cur, j.fid = c, fid
	j.mu.Unlock()
	// The cache serves again once the records missed while we were away
	// are applied: the read answers at once if there are any, and blocks
	// if there are none, which cannot be told from a slow answer; so the
	// first answer or catchUp, whichever comes first. A new journal has
	// missed nothing.
	if created {
		j.ready(c)
	} else {
		time.AfterFunc(catchUp, func() { j.ready(c) })
	}
	go j.read(c, fid)
	go j.flushDropped(c, fid)
	return nil
}

// catchUp is how long after opening its journal a client waits at most
// for the records it missed before it serves from its cache again.
const catchUp = time.Second

// ready turns the cache on, c's journal being read and caught up.
func (j *jreader) ready(c *session.Conn) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cur == c && c.Alive() {
		j.fs.cc.On.Store(true)
	}
}

// lost turns the cache off when the connection whose journal it reads is
// lost: until the journal is read again, changes go untold.
func (j *jreader) lost(c *session.Conn) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cur == c {
		j.cur = nil
		j.fs.cc.On.Store(false)
	}
}

// fallback turns caching off: the server has no controller (diod, an
// older shale serve), so nothing tells us of others' changes, and each
// request asks the server, as a client without a cache does.
func (j *jreader) fallback(why string) {
	fs := j.fs
	fs.cc.On.Store(false)
	if fs.controller.Swap(false) {
		j.dropAll()
		fs.log.Warn("9p server's journal controller is gone: caching off; a FUSE mount keeps what its kernel holds until remounted", "server", fs.where, "why", why)
		return
	}
	j.mu.Lock()
	warned := j.warned
	j.warned = true
	j.mu.Unlock()
	if !warned {
		fs.log.Info("9p server has no journal controller: nothing cached, close-to-open consistency (other clients' changes show at the next open, and within a mount's --timeout)", "server", fs.where, "why", why)
	}
}

// dropAll drops everything cached and tells the views.
func (j *jreader) dropAll() {
	j.fs.cc.DropAll()
	j.fs.ctr.resets.Add(1)
	j.fs.notice(layer.Event{Kind: layer.Everything})
}

// read keeps one read of the journal outstanding on c until c is lost.
func (j *jreader) read(c *session.Conn, fid uint32) {
	fs := j.fs
	for {
		j.mu.Lock()
		off := j.seq
		j.mu.Unlock()
		fs.ctr.journalRequests.Add(1)
		r := p9wire.DataReply{T: p9wire.Tread}
		err := c.Wait(&p9wire.Read{T: p9wire.Tread, Fid: fid, Offset: off, Count: uint32(c.IOSize(0))}, &r)
		if errors.Is(err, syscall.EINTR) {
			// The server cut the read short: a server ending on SIGTERM
			// answers its reads so, just before the connection goes.
			// Not a refusal: read again, or see the loss.
			if !c.Alive() {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			if !errors.Is(err, session.ErrLost) && c.Alive() {
				// The controller refuses us: no more callbacks, so no cache.
				j.fallback(fmt.Sprintf("read journal: %v", session.Errno(err)))
			}
			return
		}
		data := r.Data
		if len(data) == 0 {
			// A read returns records or blocks; an empty one is a
			// controller we do not understand: ask again, not in a spin.
			time.Sleep(time.Second)
			continue
		}
		for len(data) > 0 {
			r, rest, err := journal.Next(data)
			if err != nil {
				// Records we cannot read may be any: trust nothing, and
				// start over on a journal of our own.
				fs.log.Warn("malformed journal record: dropping the cache and reconnecting", "server", fs.where)
				j.mu.Lock()
				j.uuid = newUUID()
				j.mu.Unlock()
				j.dropAll()
				c.Fail(p9wire.ErrProto)
				return
			}
			data = rest
			j.apply(&r)
		}
		j.ready(c)
	}
}

// apply applies one record: the cache drops what it names, then the
// views are told, so what they ask again is answered afresh.
func (j *jreader) apply(r *journal.Record) {
	fs := j.fs
	cc := fs.cc
	j.mu.Lock()
	if r.Epoch == j.epoch && r.Seq <= j.seq {
		j.mu.Unlock()
		return // applied already, read again on a new connection
	}
	var evs []layer.Event
	if j.epoch != 0 && r.Epoch != j.epoch {
		fs.undelegate(0)
		cc.DropAll()
		fs.ctr.resets.Add(1)
		evs = append(evs, layer.Event{Kind: layer.Everything})
	}
	j.epoch, j.seq = r.Epoch, r.Seq
	path := r.Qid.Path
	tok := layer.Token{Ino: path, Gen: fs.genOf(path)}
	switch {
	case r.Kind == journal.Recall || r.Kind == journal.Uncache:
		// Writing back takes requests: not on the journal's reader.
		go fs.wb.Recalled(path, r.Seq, r.Kind == journal.Uncache)
	case r.Kind == journal.Follow:
		fs.wb.Follow(tok)
	case r.Kind == journal.Return:
		// Its handles open on the server: not on the journal's reader.
		go fs.wb.Return(path, r.Seq, func(path uint64) { fs.kept.pushPath(context.Background(), path) })
	case r.Kind == journal.Reset || r.Kind != journal.Change:
		fs.undelegate(0)
		cc.DropAll()
		fs.ctr.resets.Add(1)
		evs = append(evs, layer.Event{Kind: layer.Everything})
		if r.Kind == journal.Reset && fs.wb.Sprite() {
			// Recalls may have been lost with the queue: all is
			// written back, and a Clean of no file answers them all.
			go func(seq uint64) {
				fs.wb.WriteBackAll(context.Background(), writeback.Reset)
				j.send(journal.Record{Kind: journal.Clean, Seq: seq})
			}(r.Seq)
		}
	case !r.Known():
		fs.undelegate(path)
		cc.Drop(path)
		if r.Qid.Type&p9wire.QTDir != 0 {
			evs = append(evs, layer.Event{Kind: layer.Everything})
		} else {
			evs = append(evs, layer.Event{Kind: layer.Data, Token: tok})
		}
	default:
		for _, f := range r.Fields {
			switch f.Type {
			default: // journal.Whole, or another that says as much
				fs.undelegate(path)
				cc.Drop(path)
				evs = append(evs, layer.Event{Kind: layer.Data, Token: tok})
				if r.Qid.Type&p9wire.QTDir != 0 {
					evs = append(evs, layer.Event{Kind: layer.Everything})
				}
			case journal.Attrs:
				cc.DropAttrs(path)
				evs = append(evs, layer.Event{Kind: layer.Attrs, Token: tok})
			case journal.Data:
				fs.undelegate(path) // a change the server did not take it back for
				cc.DropData(path, f.Off, f.Len)
				evs = append(evs, layer.Event{Kind: layer.Data, Token: tok, Off: int64(f.Off), Len: int64(f.Len)})
			case journal.Entry:
				cc.DropEntry(path, f.Name)
				evs = append(evs, layer.Event{Kind: layer.Entries, Token: tok, Name: f.Name})
			}
		}
	}
	fs.ctr.records.Add(1)
	hook := j.onRecord
	j.mu.Unlock()
	for _, ev := range evs {
		if ev.Kind == layer.Everything || ev.Token.Gen != 0 {
			fs.notice(ev)
		}
	}
	if hook != nil {
		hook(r, evs)
	}
}

// flushDropped reports, now and then, the QIDs the cache let go and no
// node holds, so the controller stops telling us of them.
func (j *jreader) flushDropped(c *session.Conn, fid uint32) {
	fs := j.fs
	t := time.NewTicker(j.flushWait)
	defer t.Stop()
	for {
		select {
		case <-c.Dead():
			return
		case <-t.C:
		}
		paths := fs.cc.TakeDropped()
		if len(paths) == 0 {
			continue
		}
		j.mu.Lock()
		epoch := j.epoch
		j.mu.Unlock()
		var buf []byte
		for _, p := range paths {
			buf = journal.Append(buf, &journal.Record{Kind: journal.Dropped, Epoch: epoch, Qid: p9wire.Qid{Path: p}})
		}
		if _, err := c.WriteAt(fid, 0, buf, 0); err != nil {
			return
		}
		fs.ctr.dropped.Add(uint64(len(paths)))
		// A fetch that overlapped the report may have had the QID
		// registered before the report unregistered it: whatever it put
		// or handed out goes.
		for _, p := range fs.cc.AfterDropped(paths) {
			fs.notice(layer.Event{Kind: layer.Data, Token: layer.Token{Ino: p, Gen: fs.genOf(p)}})
		}
	}
}

// notice raises ev as a change made beside the stack (View 0), for the
// views to drop what their kernels hold.
func (fs *FS) notice(ev layer.Event) {
	if fs.st.Events().Active() {
		fs.st.Events().Raise(ev)
	}
}
