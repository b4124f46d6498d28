package session

import (
	"errors"
	"fmt"
	"log/slog"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/shalefs/shale/p9wire"
)

// Cred is whom a request acts as: a uid, and when known the gid and
// supplementary groups of the caller, which a server that speaks shale's
// credentials protocol (p9wire.CredsAname) acts with; others, and when
// they are not known (Plain), the server takes the uid's groups from its
// own user database.
type Cred struct {
	Uid    uint32
	Gid    uint32
	Groups []uint32 // sorted, no duplicates
	Plain  bool     // the uid alone: gid and groups unknown
}

// A connection attaches once per Cred (Conn.Root), and what fids its
// owners keep are per Cred too; they name one by its number in a table
// of the process (Who), which a uint32 carries where a uid did.
//
// The table only grows: the credentials a mount's callers have are few
// (one per user and group set, a test suite's dozens), and their numbers
// must stay good for the fids and delayed writes that hold them. Past
// maxCreds a new group set acts as its uid alone (Plain), as every
// caller did before the protocol, and says so once.
const maxCreds = 1 << 16

var creds struct {
	mu     sync.RWMutex
	byKey  map[string]uint32
	list   []Cred
	warned atomic.Bool
}

// Who is c's number; c.Groups need not be sorted.
func Who(c Cred) uint32 {
	if c.Plain {
		c.Gid, c.Groups = 0, nil
	} else {
		c.Groups = slices.Compact(slices.Sorted(slices.Values(c.Groups)))
	}
	key := c.key()
	creds.mu.RLock()
	n, ok := creds.byKey[key]
	creds.mu.RUnlock()
	if ok {
		return n
	}
	creds.mu.Lock()
	if n, ok := creds.byKey[key]; ok {
		creds.mu.Unlock()
		return n
	}
	if !c.Plain && len(creds.list) >= maxCreds {
		creds.mu.Unlock()
		if !creds.warned.Swap(true) {
			slog.Warn("9p: callers with more sets of credentials than shale keeps act with their user's groups on the server", "max", maxCreds)
		}
		return Who(Cred{Uid: c.Uid, Plain: true})
	}
	if creds.byKey == nil {
		creds.byKey = map[string]uint32{}
	}
	n = uint32(len(creds.list))
	creds.list = append(creds.list, c)
	creds.byKey[key] = n
	creds.mu.Unlock()
	return n
}

// CredOf is the Cred numbered who (Who).
func CredOf(who uint32) Cred {
	creds.mu.RLock()
	defer creds.mu.RUnlock()
	return creds.list[who]
}

// UID is the uid of the Cred numbered who.
func UID(who uint32) uint32 { return CredOf(who).Uid }

func (c Cred) key() string {
	if c.Plain {
		return "u" + strconv.FormatUint(uint64(c.Uid), 10)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d:%d:", c.Uid, c.Gid)
	for _, g := range c.Groups {
		fmt.Fprintf(&b, "%d,", g)
	}
	return b.String()
}

// Root returns the attach fid of the credentials numbered who, attaching
// on first use.
func (c *Conn) Root(who uint32) (uint32, error) {
	c.mu.Lock()
	r := c.roots[who]
	if r == nil {
		r = &root{done: make(chan struct{})}
		c.roots[who] = r
		c.mu.Unlock()
		r.fid = c.NewFid()
		r.err = c.attachCred(r.fid, CredOf(who))
		if r.err != nil {
			c.mu.Lock()
			delete(c.roots, who) // try again on the next request
			c.mu.Unlock()
		}
		close(r.done)
	} else {
		c.mu.Unlock()
		<-r.done
	}
	return r.fid, r.err
}

// attachCred attaches fid to the connection's tree as cr: with its
// groups if the server speaks the credentials protocol and takes them,
// else as its uid alone.
func (c *Conn) attachCred(fid uint32, cr Cred) error {
	if cr.Plain || c.noCreds.Load() {
		return c.AttachAs(fid, cr.Uid, c.aname)
	}
	m := p9wire.Creds{Gid: cr.Gid, Groups: cr.Groups}
	var e p9wire.Enc
	m.Encode(&e)
	if len(e.B) > c.IOSize(0) {
		return c.AttachAs(fid, cr.Uid, c.aname) // too many groups for one message
	}
	uname := unameOf(cr.Uid)
	afid := c.NewFid()
	err := c.RPC(&p9wire.Auth{Afid: afid, Uname: uname, Aname: p9wire.CredsAname, NUname: cr.Uid}, &p9wire.QidReply{T: p9wire.Tauth})
	if err != nil {
		c.PutFid(afid)
		if errors.Is(err, ErrLost) {
			return err
		}
		// It does not speak the protocol: the uid alone, from now on.
		c.noCreds.Store(true)
		return c.AttachAs(fid, cr.Uid, c.aname)
	}
	defer func() { go c.Clunk(afid) }()
	if err := c.RPC(&p9wire.Write{Fid: afid, Data: e.B}, &p9wire.WriteReply{}); err != nil {
		if errors.Is(err, ErrLost) {
			return err
		}
		// Refused: the connection may not claim them (export/creds.go).
		c.log.Debug("9p: the server refused the caller's groups: acting with its user's groups there", "uid", cr.Uid, "gid", cr.Gid, "err", err)
		return c.AttachAs(fid, cr.Uid, c.aname)
	}
	err = c.RPC(&p9wire.Attach{Fid: fid, Afid: afid, Uname: uname, Aname: c.aname, NUname: cr.Uid},
		&p9wire.QidReply{T: p9wire.Tattach})
	if err != nil {
		c.PutFid(fid)
	}
	return err
}

// AttachAs attaches fid to the tree aname as uid: n_uname carries it,
// and uname its name when the local user database knows it, for servers
// that look users up by name. On failure fid is free again.
func (c *Conn) AttachAs(fid, uid uint32, aname string) error {
	_, err := c.AttachQid(fid, uid, aname)
	return err
}

// AttachQid is AttachAs, returning the QID of what fid names.
func (c *Conn) AttachQid(fid, uid uint32, aname string) (p9wire.Qid, error) {
	r := p9wire.QidReply{T: p9wire.Tattach}
	err := c.RPC(&p9wire.Attach{Fid: fid, Afid: p9wire.NoFid, Uname: unameOf(uid), Aname: aname, NUname: uid}, &r)
	if err != nil {
		c.PutFid(fid)
	}
	return r.Qid, err
}

// unameOf is uid's name in the local user database, or "".
func unameOf(uid uint32) string {
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return ""
}
