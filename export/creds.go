package export

import (
	"context"
	"os/user"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// Credentials a client claims for its callers (p9wire.CredsAname): a
// Tauth of that name gives a credentials fid for a uid the connection may
// attach as, a Twrite of p9wire.Creds to it says the caller's gid and
// groups, and a Tattach with it as afid acts with them.
//
// Whom a claim is believed from is what Network trust II says of the
// connection's peer (p9net.Peer). A peer that may act as any user (a root
// process of this machine, a holder of the host key, a connection the
// server's owner vouches for) is trusted to say its users' groups, as an
// NFS server trusts a client host's AUTH_SYS; root squash applies to what
// it says as to an attach. Any other peer acts as one user, and may claim
// only what the server's user database gives that user: its gid must be
// the user's group or one of its groups (newgrp, a setgid program), and
// its groups are the database's whatever it says, as a process cannot
// drop its groups without privilege (dropping one would pass a file's
// group-deny mode, 0604).

// credFid is a credentials fid: who is the uid's own caller until a
// claim is written.
type credFid struct {
	*fid
	uid   uint32
	claim atomic.Pointer[layer.Caller]
}

// credQid is the QID of every credentials fid: far from inode numbers
// and from the synthetic ones.
var credQid = p9wire.Qid{Type: p9wire.QTAuth, Path: jpath("\x02creds")}

// auth serves Tauth: a credentials fid for CredsAname; any other name
// gets ENOENT, what clients (diod's, Linux's) take for "attach without":
// a key, when configured, is TLS before any message.
func (c *conn) auth(ctx context.Context, d *p9wire.Dec) (p9wire.Message, syscall.Errno) {
	m := decode[p9wire.Auth](d)
	if m == nil {
		return nil, syscall.EINVAL
	}
	if m.Aname != p9wire.CredsAname {
		return nil, syscall.ENOENT
	}
	uid, e := c.attacher(m.Uname, m.NUname)
	if e != 0 {
		return nil, e
	}
	if c.full() {
		return nil, syscall.EMFILE
	}
	f := c.newFid(c.s.caller(uid))
	f.is = &credFid{fid: f, uid: uid}
	if e := c.bind(m.Afid, f, nil); e != 0 {
		return nil, e
	}
	return &p9wire.QidReply{T: p9wire.Tauth, Qid: credQid}, 0
}

// attacher is the uid an attach or a Tauth names (n_uname, else uname in
// the user database, else nobody), or EPERM if the connection's peer may
// not act as it.
func (c *conn) attacher(uname string, n uint32) (uint32, syscall.Errno) {
	uid := n
	if uid == p9wire.NoUID {
		uid = nobody
		if u, err := user.Lookup(uname); err == nil {
			if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
				uid = uint32(n)
			}
		}
	}
	if !c.peer.May(uid) {
		// 9P carries no message: the server's log says why, once.
		if !c.warned.Swap(true) {
			c.s.log.Warn("9p: attach refused: a client may attach only as a user its connection proves it is", "uid", uid, "peer", c.peer.String())
		}
		return 0, syscall.EPERM
	}
	return uid, 0
}

// credsOf is the caller an attach as uid with afid acts as: its claim,
// if afid is a credentials fid of uid with one; EPERM if it is one of
// another uid or without a claim. An afid that names no fid is no
// authentication, as before the protocol was.
func (c *conn) credsOf(afid, uid uint32) (*layer.Caller, syscall.Errno) {
	if afid == p9wire.NoFid {
		return nil, 0
	}
	f, e := c.fid(afid)
	if e != 0 {
		return nil, 0
	}
	c.mu.Lock()
	cf, ok := f.is.(*credFid)
	c.mu.Unlock()
	if !ok {
		return nil, 0
	}
	who := cf.claim.Load()
	if cf.uid != uid || who == nil {
		return nil, syscall.EPERM
	}
	return who, 0
}

// write takes the claim (p9wire.Creds, at offset 0).
func (cf *credFid) write(ctx context.Context, m *p9wire.Write) (p9wire.Message, syscall.Errno) {
	var cr p9wire.Creds
	d := p9wire.Dec{B: m.Data}
	cr.Decode(&d)
	if d.Err != nil || m.Offset != 0 {
		return nil, syscall.EINVAL
	}
	who, e := cf.c.s.claimed(cf.c, cf.uid, cr)
	if e != 0 {
		return nil, e
	}
	cf.claim.Store(&who)
	return &p9wire.WriteReply{Count: uint32(len(m.Data))}, 0
}

// claimed is the caller that c's claim of cr for uid makes, or EPERM.
func (s *Server) claimed(c *conn, uid uint32, cr p9wire.Creds) (layer.Caller, syscall.Errno) {
	if c.peer.Any {
		return s.squash(uid, cr.Gid, slices.Clone(cr.Groups)), 0
	}
	g := s.groupsOf(uid)
	if cr.Gid != g.gid && !slices.Contains(g.supp, cr.Gid) {
		if !c.warned.Swap(true) {
			s.log.Warn("9p: credentials refused: a client that acts as one user may claim only its groups in the server's user database", "uid", uid, "gid", cr.Gid, "peer", c.peer.String())
		}
		return layer.Caller{}, syscall.EPERM
	}
	return s.squash(uid, cr.Gid, g.supp), 0
}

// The requests a credentials fid does not serve.

func (cf *credFid) walk(context.Context, []string) (*fid, []p9wire.Qid, syscall.Errno) {
	return nil, nil, syscall.EOPNOTSUPP
}
func (cf *credFid) xattrwalk(context.Context, string) (*xattrFid, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) getattr(context.Context, *p9wire.Getattr) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) statfs(context.Context, *p9wire.FidReq) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) lopen(context.Context, *p9wire.Lopen) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) lcreate(context.Context, *p9wire.Lcreate) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) read(context.Context, *p9wire.Read) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) readdir(context.Context, *p9wire.Read) (p9wire.Message, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP
}
func (cf *credFid) fsync(context.Context, *p9wire.Fsync) (p9wire.Message, syscall.Errno) {
	return nil, 0
}
func (cf *credFid) interrupt()                          {}
func (cf *credFid) clunk(context.Context) syscall.Errno { return 0 }
func (cf *credFid) free(context.Context)                {}
