package cache

import (
	"encoding/gob"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/objstore"
)

// The disk cache (Options.CacheDir): file data in an object store
// (objstore, the CFS design) in DIR/store, one immutable object a block,
// keyed by QID path, generation and block number; the metadata, and the
// journal's UUID, epoch and last applied sequence number, in DIR/state,
// written when the client closes. A restarted client reopens its journal
// with that UUID, reads from that sequence number what it missed, drops
// exactly that, and serves the rest from disk.
//
// DIR/state is removed once read: after a crash there is none, and the
// store, not closed cleanly, has lost its index too, so the client starts
// empty, on a new journal, never with what a record it did not see
// changed. The store's lock makes one client the owner of DIR.

const (
	storeFile = "store"
	stateFile = "state"
)

// Disk keeps blocks in an object store.
type Disk struct {
	dir    string
	server string // the server and tree whose cache it is
	st     *objstore.Store
	log    *slog.Logger
	saved  *diskState // read at open, until restore
}

// diskState is DIR/state.
type diskState struct {
	Server     string
	UUID       string
	Epoch, Seq uint64
	Ents       []savedEnt
}

type savedEnt struct {
	Path, Gen              uint64
	Attr                   layer.Attr
	HasAttr                bool
	Search, Lister, Reader []uint32
	Names                  map[string]uint64
	List                   []layer.DirEntry
	HasList                bool
	Link                   []byte
	HasLink                bool
	Blks                   map[int64]int
	Xattrs                 map[string]XattrVal
}

// OpenDisk takes dir: the store in it (made with size bytes if it has
// none) and what the last client saved there.
func OpenDisk(dir string, size int64, server string, log *slog.Logger) (*Disk, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
	}
	path := filepath.Join(dir, storeFile)
	var st *objstore.Store
	_, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		st, err = objstore.Format(path, size, objstore.Options{})
	} else {
		st, err = objstore.Open(path, objstore.Options{})
	}
	if err != nil {
		return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
	}
	d := &Disk{dir: dir, server: server, st: st, log: log}
	sp := filepath.Join(dir, stateFile)
	if f, err := os.Open(sp); err == nil {
		var s diskState
		if err := gob.NewDecoder(f).Decode(&s); err != nil {
			log.Warn("cache state unreadable: starting empty", "file", sp, "err", err)
		} else if s.Server != server {
			log.Info("cache state is of another server: starting empty", "file", sp, "was", s.Server)
		} else {
			d.saved = &s
		}
		f.Close()
		// From here on a crash must not leave it to the next client.
		if err := os.Remove(sp); err != nil {
			st.Close()
			return nil, fmt.Errorf("--cache-dir %s: %v", dir, err)
		}
	}
	return d, nil
}

// JournalPos is how far a client read its journal: the disk cache
// keeps it with what it cached, to resume from it.
type JournalPos struct {
	UUID       string
	Epoch, Seq uint64
}

// Restore gives c what was saved, and the journal position it is
// current as of; false if nothing was.
func (d *Disk) Restore(c *Cache) (JournalPos, bool) {
	s := d.saved
	d.saved = nil
	if s == nil || s.UUID == "" {
		return JournalPos{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range s.Ents {
		se := &s.Ents[i]
		e := c.entLocked(se.Path, se.Gen)
		e.attr, e.hasAttr = se.Attr, se.HasAttr
		e.search, e.lister, e.reader = se.Search, se.Lister, se.Reader
		e.names = se.Names
		e.list, e.hasList = se.List, se.HasList
		e.link, e.hasLink = se.Link, se.HasLink
		e.blks = se.Blks
		e.xattrs = se.Xattrs
	}
	c.dropped = nil
	d.log.Info("disk cache restored", "dir", d.dir, "files", len(s.Ents), "journal", s.UUID, "seq", s.Seq)
	return JournalPos{s.UUID, s.Epoch, s.Seq}, true
}

// Save writes c, current as of the journal position pos (nil: no
// journal, nothing to resume), and closes the store. The caller has
// ended the journal's reading.
func (d *Disk) Save(pos *JournalPos, c *Cache) error {
	s := diskState{Server: d.server}
	if pos != nil {
		s.UUID, s.Epoch, s.Seq = pos.UUID, pos.Epoch, pos.Seq
		c.mu.Lock()
		// Copies of the maps: a put that began before the close may
		// still change them while they are encoded.
		for el := c.lru.Front(); el != nil; el = el.Next() {
			e := el.Value.(*centry)
			s.Ents = append(s.Ents, savedEnt{Path: e.path, Gen: e.gen, Attr: e.attr, HasAttr: e.hasAttr,
				Search: e.search, Lister: e.lister, Reader: e.reader, Names: maps.Clone(e.names),
				List: e.list, HasList: e.hasList, Link: e.link, HasLink: e.hasLink,
				Blks: maps.Clone(e.blks), Xattrs: maps.Clone(e.xattrs)})
		}
		c.mu.Unlock()
	}
	if err := d.st.Close(); err != nil {
		return fmt.Errorf("--cache-dir %s: closing the store: %v", d.dir, err)
	}
	if s.UUID == "" {
		return nil // no journal: nothing to resume
	}
	tmp := filepath.Join(d.dir, stateFile+".new")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		err = gob.NewEncoder(f).Encode(&s)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(d.dir, stateFile))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--cache-dir %s: saving the cache's state: %v", d.dir, err)
	}
	return nil
}

func (d *Disk) get(path, gen uint64, idx int64) ([]byte, bool) {
	b, err := d.st.Read(blockName(path, gen, idx))
	return b, err == nil
}

func (d *Disk) put(path, gen uint64, idx int64, b []byte) bool {
	// The store keeps the slice until its write is done.
	return d.st.Create(blockName(path, gen, idx), append([]byte(nil), b...)) == nil
}

func (d *Disk) drop(path, gen uint64, idx int64) {
	d.st.Remove(blockName(path, gen, idx))
}

func (d *Disk) bytes() int64 { return d.st.Stats().Used }
