package net

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/shalefs/shale/p9wire"
)

// claimAttach claims gid and groups for uid (credentials over 9P, through
// the credentials fid afid) and attaches fid with them: the errno of the
// Tauth, the Twrite or the Tattach.
func (p *p9) claimAttach(fid, afid, uid, gid uint32, groups ...uint32) syscall.Errno {
	p.t.Helper()
	if _, e := p.try("auth", p9wire.Tauth, afid, "", p9wire.CredsAname, uid); e != 0 {
		return e
	}
	var enc p9wire.Enc
	(&p9wire.Creds{Gid: gid, Groups: groups}).Encode(&enc)
	if _, e := p.try("write creds", p9wire.Twrite, afid, uint64(0), uint32(len(enc.B)), enc.B); e != 0 {
		return e
	}
	_, e := p.try("attach", p9wire.Tattach, fid, afid, "", "", uid)
	return e
}

// readAt reads name below the attach fid (through fid+1).
func (p *p9) readAt(fid uint32, name string) ([]byte, syscall.Errno) {
	p.t.Helper()
	p.rpc("walk "+name, p9wire.Twalk, fid, fid+1, uint16(1), name)
	defer p.try("clunk", p9wire.Tclunk, fid+1)
	if _, e := p.try("open "+name, p9wire.Tlopen, fid+1, uint32(syscall.O_RDONLY)); e != 0 {
		return nil, e
	}
	b, e := p.try("read "+name, p9wire.Tread, fid+1, uint64(0), uint32(100))
	if e != 0 {
		return nil, e
	}
	return b[4:], 0
}

// TestCredsLocalPeers: credentials over 9P are believed from a peer that
// may act as anyone (root over a unix socket or loopback TCP): it reads a
// 0640 root:users file as nobody with users (100) claimed, which nobody
// is not in on the server. A program of another user may not claim a
// group its user database does not give (EPERM), and a group list it
// claims is not believed. Before credentials over 9P root's claim failed
// (ENOENT: no such Tauth).
func TestCredsLocalPeers(t *testing.T) {
	lower := tempDir(t)
	grp := filepath.Join(lower, "grp")
	writeFile(t, grp, []byte("g\n"), 0o640)
	if err := os.Chown(grp, 0, 100); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(tempDir(t), "s.sock")
	serve(t, sock, lower)
	openSocket(t, sock)
	addr := freePort(t)
	serve(t, addr, lower)
	eperm, eacces := strconv.Itoa(int(syscall.EPERM)), strconv.Itoa(int(syscall.EACCES))
	for _, at := range [][2]string{{"unix", sock}, {"tcp", addr}} {
		p := probe(t, "claim", at[0], at[1], "100", "100", "grp")
		if got := p.said("claim"); got != eperm {
			t.Errorf("%s: nobody claimed gid 100: %s, read %s; want EPERM", at[0], got, p.said("read"))
		}
		p = probe(t, "claim", at[0], at[1], "65534", "100", "grp")
		if c, r := p.said("claim"), p.said("read"); c != "0" || r != eacces+` ""` {
			t.Errorf("%s: nobody claimed group 100 beside its own: claim %s, read %s; want 0, EACCES", at[0], c, r)
		}
		root := dialAs(t, at[0], at[1], 0)
		if e := root.claimAttach(10, 20, 65534, 65534, 65534, 100); e != 0 {
			t.Fatalf("%s: root's claim for nobody with group 100: %v", at[0], e)
		}
		if b, e := root.readAt(10, "grp"); e != 0 || string(b) != "g\n" {
			t.Errorf("%s: nobody with group 100 claimed by root read %q, %v; want \"g\\n\"", at[0], b, e)
		}
		root.rpc("attach", p9wire.Tattach, uint32(30), p9wire.NoFid, "", "", uint32(65534))
		if _, e := root.readAt(30, "grp"); e != syscall.EACCES {
			t.Errorf("%s: nobody without a claim: %v, want EACCES (the user database's groups)", at[0], e)
		}
	}
}
