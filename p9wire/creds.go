package p9wire

// Credentials over 9P, as NFS's AUTH_SYS carries them. 9P2000.L's attach
// names a uid only, and a server looks the user's groups up in its own
// user database (diod does so too), so a caller's gid and supplementary
// groups are lost: a group the caller is in on the client but not in the
// server's database, a setgid program's group, the groups of a process
// that changed them. shale's client says them through an authentication
// fid, 9P's place for what an attach needs beyond its names:
//
//   - Tauth with aname CredsAname and the caller's uid (n_uname) asks for
//     a credentials fid (its QID's type is QTAuth);
//   - the client writes Creds to it (one Twrite at offset 0): the server
//     answers EPERM to credentials the connection may not claim;
//   - Tattach with it as afid (and the same uid) acts with them.
//
// A server that does not speak it answers that Tauth with an error (diod
// without authentication, shale serve before it), and the client attaches
// without an afid: the server's user database decides, as before. A
// client that does not ask (Linux's 9P client, diod's) is served as
// before.
const CredsAname = "#creds"

// MaxGroups bounds Creds.Groups: Linux's NGROUPS_MAX.
const MaxGroups = 65536

// Creds is what a client writes to a credentials fid: the gid and the
// supplementary groups its caller acts with (the uid is the Tauth's).
type Creds struct {
	Gid    uint32
	Groups []uint32
}

func (m *Creds) Encode(e *Enc) {
	e.U32(m.Gid)
	e.U32(uint32(len(m.Groups)))
	for _, g := range m.Groups {
		e.U32(g)
	}
}

func (m *Creds) Decode(d *Dec) {
	m.Gid = d.U32()
	n := d.U32()
	if d.Err != nil || n > MaxGroups || uint64(n)*4 != uint64(len(d.B)) {
		d.Err = ErrProto
		return
	}
	m.Groups = make([]uint32, n)
	for i := range m.Groups {
		m.Groups[i] = d.U32()
	}
}
