package export

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// rights is the server's record of which clients may hold delayed writes
// of which files: a client's journal name (its UUID) and principal (who
// its connections' peers are, p9net.Peer) for each file it opened for
// writing and has not said clean of. It is kept on stable storage, so
// that after a restart a reclaim (a Dirty record) is taken only from the
// client that held the file before, as NFSv4 servers keep their clients'
// records for recovery (RFC 7530, 9.6.3): no one else can take a file's
// reclaim over, nor make its opens wait for writes it never held.
//
// The file is a log: "+ UUID PATH PRINCIPAL" grants, "- UUID PATH"
// revokes, appended (and synced) by a goroutine of its own, so that no
// open waits for the disk under the server's locks. An open for writing
// is answered once its grant is written (Recorded), not synced: a server
// killed at any moment after it keeps the line; a machine's crash may
// lose the lines of its last moments, whose clients' reclaims are then
// refused and their data kept as conflict copies, not lost.
type rights struct {
	log  *slog.Logger
	path string // "": in memory only (nothing is reclaimable after a restart)

	// Lock order: wmu, then mu. wmu orders the writes of the file: a
	// batch taken is written before the next is taken.
	wmu     sync.Mutex
	mu      sync.Mutex
	held    map[rightKey]string // this server's grants: principal
	prior   map[rightKey]string // the last server's, not reclaimed yet
	pending []byte              // lines not written yet
	lines   int                 // lines in the file
	kick    chan struct{}       // pending has lines
	closed  bool
	// queued counts the lines given to pending, written those in the
	// file (synced or not); wrote is signalled as written grows.
	queued, written uint64
	wrote           *sync.Cond
}

type rightKey struct {
	uuid string
	path uint64
}

const rightsHeader = "shale-rights 1\n"

// openRights reads what the last server recorded at path and starts this
// server's record there.
func openRights(path string, log *slog.Logger) *rights {
	r := &rights{log: log, path: path, held: map[rightKey]string{}, prior: map[rightKey]string{}, kick: make(chan struct{}, 1)}
	r.wrote = sync.NewCond(&r.mu)
	if path == "" {
		return r
	}
	if f, err := os.Open(path); err == nil {
		r.prior = readRights(f)
		f.Close()
	} else if !os.IsNotExist(err) {
		log.Warn("9p: the clients' rights to reclaim delayed writes could not be read: reclaims after this restart are refused (their data is kept as conflict copies)", "file", path, "err", err)
	}
	if err := r.rewrite(0); err != nil {
		log.Warn("9p: the clients' rights to reclaim delayed writes cannot be recorded: after a restart their reclaims will be refused", "file", path, "err", err)
		r.path = ""
		return r
	}
	go r.flusher()
	return r
}

// readRights replays a log; lines it does not understand are skipped.
func readRights(f *os.File) map[rightKey]string {
	m := map[rightKey]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) < 3 || !validUUID(fs[1]) {
			continue
		}
		p, err := strconv.ParseUint(fs[2], 10, 64)
		if err != nil {
			continue
		}
		k := rightKey{fs[1], p}
		switch {
		case fs[0] == "+" && len(fs) == 4:
			m[k] = fs[3]
		case fs[0] == "-":
			delete(m, k)
		}
	}
	return m
}

// grant records that the client uuid of principal may hold delayed writes
// of path.
func (r *rights) grant(uuid, principal string, path uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := rightKey{uuid, path}
	if r.held[k] == principal {
		return
	}
	r.held[k] = principal
	if r.prior[k] == principal {
		delete(r.prior, k) // reclaimed: its line is in the file already
		return
	}
	delete(r.prior, k)
	r.addLocked(fmt.Sprintf("+ %s %d %s\n", uuid, path, principal))
}

// revoke records that the client uuid holds no delayed writes of path.
func (r *rights) revoke(uuid string, path uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := rightKey{uuid, path}
	if _, ok := r.held[k]; !ok {
		return
	}
	delete(r.held, k)
	r.addLocked(fmt.Sprintf("- %s %d\n", uuid, path))
}

// reclaimable tells whether the last server recorded that client uuid of
// principal held delayed writes of path.
func (r *rights) reclaimable(uuid, principal string, path uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.prior[rightKey{uuid, path}]
	return ok && p == principal
}

// supersede forgets the last server's rights to path: a client other than
// uuid opened it for writing, and a reclaim would undo its writes.
func (r *rights) supersede(path uint64, uuid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.prior {
		if k.path == path && k.uuid != uuid {
			delete(r.prior, k)
			r.addLocked(fmt.Sprintf("- %s %d\n", k.uuid, k.path))
		}
	}
}

func (r *rights) addLocked(line string) {
	if r.path == "" || r.closed {
		return
	}
	r.pending = append(r.pending, line...)
	r.queued++
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Recorded waits until every line given so far is written to the file
// (or for a second at most, if the disk hangs; or not at all without
// a file): an open for writing is answered after its grant is there.
func (r *rights) Recorded() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.queued == r.written || r.path == "" {
		return
	}
	want := r.queued
	t := time.AfterFunc(time.Second, func() {
		r.mu.Lock()
		r.written = max(r.written, want) // given up on
		r.wrote.Broadcast()
		r.mu.Unlock()
	})
	defer t.Stop()
	for r.written < want && !r.closed && r.path != "" {
		r.wrote.Wait()
	}
}

// flusher writes the pending lines, and rewrites the file when most of
// its lines are dead.
func (r *rights) flusher() {
	for range r.kick {
		r.wmu.Lock()
		r.mu.Lock()
		b, upto := r.pending, r.queued
		r.pending = nil
		n := strings.Count(string(b), "\n")
		compact := r.lines+n > 2*(len(r.held)+len(r.prior))+1024
		r.mu.Unlock()
		var err error
		if compact {
			err = r.rewrite(upto)
		} else if err = r.appendLines(b, upto); err == nil {
			r.mu.Lock()
			r.lines += n
			r.mu.Unlock()
		}
		r.wmu.Unlock()
		if err != nil {
			r.log.Warn("9p: recording the clients' rights to reclaim delayed writes failed", "file", r.path, "err", err)
		}
	}
}

// wroteUpto tells the opens waiting that the lines up to seq are in the
// file.
func (r *rights) wroteUpto(seq uint64) {
	r.mu.Lock()
	r.written = max(r.written, seq)
	r.wrote.Broadcast()
	r.mu.Unlock()
}

// rewrite replaces the file by the rights known now, and forgets the
// pending lines (what they say is in it); upto is the last line given
// before the call.
func (r *rights) rewrite(upto uint64) error {
	r.mu.Lock()
	upto = max(upto, r.queued)
	b := []byte(rightsHeader)
	for _, m := range []map[rightKey]string{r.prior, r.held} {
		for k, p := range m {
			b = fmt.Appendf(b, "+ %s %d %s\n", k.uuid, k.path, p)
		}
	}
	r.pending = nil
	r.lines = strings.Count(string(b), "\n")
	r.mu.Unlock()
	tmp := r.path + ".new"
	err := writeSync(tmp, os.O_TRUNC|os.O_CREATE, b, nil)
	if err == nil {
		err = os.Rename(tmp, r.path)
	}
	if err == nil {
		r.wroteUpto(upto)
	}
	return err
}

// appendLines appends b, the lines up to seq, to the file: the opens
// waiting for them go on once they are written, before the sync.
func (r *rights) appendLines(b []byte, seq uint64) error {
	return writeSync(r.path, os.O_APPEND, b, func() { r.wroteUpto(seq) })
}

// writeSync writes b to path, opened with flag, tells wrote (if not nil),
// and syncs it.
func writeSync(path string, flag int, b []byte, wrote func()) error {
	f, err := os.OpenFile(path, os.O_WRONLY|flag, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		if wrote != nil {
			wrote()
		}
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// close writes what is pending, at the server's end.
func (r *rights) close() {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	b, upto := r.pending, r.queued
	r.pending = nil
	done := r.closed || r.path == ""
	r.mu.Unlock()
	if !done && len(b) > 0 {
		if err := r.appendLines(b, upto); err != nil {
			r.log.Warn("9p: recording the clients' rights to reclaim delayed writes failed", "file", r.path, "err", err)
		}
	}
	r.mu.Lock()
	r.closed = true
	r.wrote.Broadcast()
	r.mu.Unlock()
}
