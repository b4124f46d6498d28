package export

import (
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/p9wire"
)

const tAuth = 102

// identConn is a connection whose peer is what a p9net listener would
// say: a local user's process.
type identConn struct {
	net.Conn
	p p9net.Peer
}

func (c identConn) Peer() p9net.Peer { return c.p }

// dialAsPeer is rawDial over a connection of peer p.
func (f *fixture) dialAsPeer(t testing.TB, p p9net.Peer) *raw {
	t.Helper()
	return f.rawOver(t, func(c net.Conn) net.Conn { return identConn{c, p} })
}

// claim asks for a credentials fid afid for uid and writes gid and groups
// to it: the errno of the Tauth or of the Twrite (0: taken).
func (r *raw) claim(t testing.TB, afid, uid, gid uint32, groups ...uint32) uint32 {
	t.Helper()
	typ, body := r.rpc(t, frame(tAuth, 1, afid, "", p9wire.CredsAname, uid))
	if e, err := lerror(typ, body); err == nil {
		return e
	}
	if body[0] != p9wire.QTAuth {
		t.Fatalf("Rauth QID type %#x, want QTAuth", body[0])
	}
	var e p9wire.Enc
	(&p9wire.Creds{Gid: gid, Groups: groups}).Encode(&e)
	typ, body = r.rpc(t, frame(tWrite, 1, afid, uint64(0), uint32(len(e.B)), e.B))
	if e, err := lerror(typ, body); err == nil {
		return e
	}
	if n := binary.LittleEndian.Uint32(body); n != uint32(len(e.B)) {
		t.Fatalf("Rwrite count %d, want %d", n, len(e.B))
	}
	return 0
}

// attachWith attaches fid as uid with afid: its errno (0: attached).
func (r *raw) attachWith(t testing.TB, fid, afid, uid uint32) uint32 {
	t.Helper()
	e, _ := lerror(r.rpc(t, frame(tAttach, 1, fid, afid, "", "", uid)))
	return e
}

// readable tells whether the file name below attach fid opens for
// reading (the walk and open go through fid+1).
func (r *raw) readable(t testing.TB, fid uint32, name string) bool {
	t.Helper()
	r.must(t, "walk "+name, twalk(1, fid, fid+1, name))
	typ, _ := r.rpc(t, frame(tLopen, 1, fid+1, uint32(0)))
	r.must(t, "clunk", frame(tClunk, 1, fid+1))
	return typ != rLerror
}

// Credentials over 9P: a connection trusted to act as anyone says its
// caller's gid and groups, and the server acts with them; one that acts
// as one user may not claim groups its user database does not give.
func TestCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to other users needs root")
	}
	f := newFixture(t, Options{})
	os.Chmod(f.dir, 0o755)
	grp := filepath.Join(f.dir, "grp")
	os.WriteFile(grp, []byte("g"), 0o640)
	os.Chown(grp, 0, 65532)
	gw := filepath.Join(f.dir, "gw")
	os.Mkdir(gw, 0o770)
	os.Chown(gw, 0, 65532)
	stat := func(t *testing.T, name string) (uid, gid uint32) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(gw, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}

	t.Run("trusted", func(t *testing.T) {
		r := f.rawDial(t) // vouched for: any user
		r.must(t, "version", frame(tVersion, 0xffff, uint32(64<<10), "9P2000.L"))
		if e := r.claim(t, 100, nobodyUid, 65533, 65533, 65532); e != 0 {
			t.Fatalf("claim: errno %d", e)
		}
		if e := r.attachWith(t, 0, 100, nobodyUid); e != 0 {
			t.Fatalf("attach with the claim: errno %d", e)
		}
		if !r.readable(t, 0, "grp") {
			t.Fatal("0640 root:65532 not readable with group 65532 claimed")
		}
		r.must(t, "walk gw", twalk(1, 0, 1, "gw"))
		r.must(t, "create", frame(tLcreate, 1, uint32(1), "mine", uint32(2), uint32(0o644), ^uint32(0)))
		if uid, gid := stat(t, "mine"); uid != nobodyUid || gid != 65533 {
			t.Fatalf("created %d:%d, want 65534:65533 (the claimed gid)", uid, gid)
		}
		// Without the claim: the user database's groups, as before.
		if e := r.attachWith(t, 10, p9wire.NoFid, nobodyUid); e != 0 {
			t.Fatalf("attach: errno %d", e)
		}
		if r.readable(t, 10, "grp") {
			t.Fatal("0640 root:65532 readable without the claim")
		}
		// The claim is the uid's only, and must be written first.
		if e := r.attachWith(t, 20, 100, 1); e != uint32(unix.EPERM) {
			t.Fatalf("attach as another uid with the claim: errno %d, want EPERM", e)
		}
		r.must(t, "auth", frame(tAuth, 1, uint32(101), "", p9wire.CredsAname, uint32(nobodyUid)))
		if e := r.attachWith(t, 20, 101, nobodyUid); e != uint32(unix.EPERM) {
			t.Fatalf("attach with an empty claim: errno %d, want EPERM", e)
		}
		// Root squash applies to what is claimed.
		if e := r.claim(t, 102, 0, 0, 0, 65532); e != 0 {
			t.Fatalf("claim as root: errno %d", e)
		}
		if e := r.attachWith(t, 30, 102, 0); e != 0 {
			t.Fatalf("attach as root: errno %d", e)
		}
		r.must(t, "walk gw", twalk(1, 30, 31, "gw"))
		typ, _ := r.rpc(t, frame(tLcreate, 1, uint32(31), "squashed", uint32(2), uint32(0o644), ^uint32(0)))
		if typ != rLerror {
			t.Fatal("squashed root created in a 0770 root:65532 directory")
		}
		// Other Tauth names: no authentication, as before.
		if e, _ := lerror(r.rpc(t, frame(tAuth, 1, uint32(103), "", "", uint32(nobodyUid)))); e != uint32(unix.ENOENT) {
			t.Fatalf("Tauth of the default tree: errno %d, want ENOENT", e)
		}
	})

	t.Run("one user", func(t *testing.T) {
		r := f.dialAsPeer(t, p9net.Peer{UID: nobodyUid, Known: true, Principal: "uid:65534", How: "unix socket peer"})
		r.must(t, "version", frame(tVersion, 0xffff, uint32(64<<10), "9P2000.L"))
		if e := r.claim(t, 100, 1, 1); e != uint32(unix.EPERM) {
			t.Fatalf("claim for another uid: errno %d, want EPERM", e)
		}
		if e := r.claim(t, 101, nobodyUid, 65532, 65532); e != uint32(unix.EPERM) {
			t.Fatalf("claim of a gid the user database does not give: errno %d, want EPERM", e)
		}
		// Its own group (nogroup) with another's: the groups are the
		// user database's.
		if e := r.claim(t, 102, nobodyUid, 65534, 65534, 65532); e != 0 {
			t.Fatalf("claim of its own group: errno %d", e)
		}
		if e := r.attachWith(t, 0, 102, nobodyUid); e != 0 {
			t.Fatalf("attach: errno %d", e)
		}
		if r.readable(t, 0, "grp") {
			t.Fatal("a one-user connection claimed group 65532 and read 0640 root:65532")
		}
	})
}
