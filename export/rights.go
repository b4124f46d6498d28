package export

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// revokes. An open for writing writes its grant (Recorded: a write(2),
// outside the server's locks) before it is answered, so that a server
// killed at any moment after keeps it; a goroutine of its own syncs the
// file (at most once a syncGap), and writes what revokes leave pending.
// A machine's crash may lose the lines of its last moments, whose
// clients' reclaims are then refused and their data kept as conflict
// copies, not lost.
type rights struct {
	log  *slog.Logger
	path string // "": in memory only (nothing is reclaimable after a restart)

	// Lock order: wmu, then mu. wmu orders the writes of the file and
	// guards f, the file open for appending.
	wmu     sync.Mutex
	f       *os.File
	mu      sync.Mutex
	held    map[rightKey]string // this server's grants: principal
	prior   map[rightKey]string // the last server's, not reclaimed yet
	pending []byte              // lines not written yet
	lines   int                 // lines in the file
	kick    chan struct{}       // pending has lines, or the file a sync due
	closed  bool
	syncs   atomic.Int64 // the flusher's syncs so far
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
	if path == "" {
		return r
	}
	if f, err := os.Open(path); err == nil {
		r.prior = readRights(f)
		f.Close()
	} else if !os.IsNotExist(err) {
		log.Warn("9p: the clients' rights to reclaim delayed writes could not be read: reclaims after this restart are refused (their data is kept as conflict copies)", "file", path, "err", err)
	}
	if err := r.rewrite(); err != nil {
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
	r.kickLocked()
}

func (r *rights) kickLocked() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Recorded writes the lines given so far to the file, not synced: an
// open for writing is answered after its grant is there.
func (r *rights) Recorded() {
	r.mu.Lock()
	none := len(r.pending) == 0
	r.mu.Unlock()
	if !none {
		r.write()
	}
}

// write writes the pending lines to the file, or rewrites the file when
// most of its lines are dead, and has the flusher sync it.
func (r *rights) write() {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	b := r.pending
	r.pending = nil
	n := strings.Count(string(b), "\n")
	compact := r.lines+n > 2*(len(r.held)+len(r.prior))+1024
	if r.closed || r.f == nil || len(b) == 0 {
		r.mu.Unlock()
		return
	}
	r.kickLocked()
	r.mu.Unlock()
	var err error
	if compact {
		err = r.rewrite()
	} else if _, err = r.f.Write(b); err == nil {
		r.mu.Lock()
		r.lines += n
		r.mu.Unlock()
	}
	if err != nil {
		r.log.Warn("9p: recording the clients' rights to reclaim delayed writes failed", "file", r.path, "err", err)
	}
}

// syncGap is the least time between the flusher's syncs: a sync after
// every open for writing cost the server more CPU than the open itself
// (cache.sh's cp -a at 0 ms, some 35 fsyncs and 5 ms of CPU a copy of 14
// entries); waiting lets one sync cover a burst of opens' lines, and a
// machine's crash loses at most syncGap more of its last moments.
const syncGap = 50 * time.Millisecond

// flusher writes what no open wrote, and syncs the file; an open's write
// does not wait for a sync under way.
func (r *rights) flusher() {
	for range r.kick {
		r.write()
		r.wmu.Lock()
		f := r.f
		r.wmu.Unlock()
		if f == nil {
			return
		}
		r.syncs.Add(1)
		if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
			r.log.Warn("9p: syncing the clients' rights to reclaim delayed writes failed", "file", r.path, "err", err)
		}
		time.Sleep(syncGap)
	}
}

// rewrite replaces the file by the rights known now (written and synced
// to a new file, renamed into place), and forgets the pending lines:
// what they say is in it. wmu is held, or no other goroutine runs yet.
func (r *rights) rewrite() error {
	r.mu.Lock()
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
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, r.path)
	}
	if err != nil {
		f.Close()
		return err
	}
	if r.f != nil {
		r.f.Close()
	}
	r.f = f
	return nil
}

// close writes what is pending, at the server's end, and syncs it.
func (r *rights) close() {
	r.write()
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	was := r.closed
	r.closed = true
	r.mu.Unlock()
	if was {
		return
	}
	if r.f != nil {
		r.f.Sync()
		r.f.Close()
		r.f = nil
	}
	close(r.kick)
}
