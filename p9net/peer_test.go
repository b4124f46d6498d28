package p9net

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestPeer: without a key, a connection says who connected, as the
// kernel tells it (SO_PEERCRED, /proc/net/tcp), for per-peer bounds too;
// a unix socket is made mode 0660.
func TestPeer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	for _, a := range []Addr{{"unix", sock}, {"tcp", "127.0.0.1:0"}, {"tcp", "[::1]:0"}} {
		l, err := Listen(a, nil)
		if err != nil {
			if a.Address == "[::1]:0" {
				continue // no IPv6 here
			}
			t.Fatal(err)
		}
		defer l.Close()
		to := l.Addr().String()
		if a.Network == "unix" {
			to = a.Address // the socket was made elsewhere and moved
		}
		c, err := net.Dial(a.Network, to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		p, ok := PeerOf(sc)
		uid := uint32(os.Geteuid())
		if !ok || !p.Known || p.UID != uid || p.Any != (uid == 0) || !p.May(uid) {
			t.Errorf("%s: peer %+v, %v; want uid %d", a, p, ok, uid)
		}
		if uid != 0 && p.May(uid+1) {
			t.Errorf("%s: uid %d may attach as another", a, uid)
		}
		// Per-peer bounds count a local user's connections by uid,
		// loopback TCP's too.
		if k := PeerKey(sc); k != uidPrincipal(uid) {
			t.Errorf("%s: PeerKey %q, want %q", a, k, uidPrincipal(uid))
		}
		sc.Close()
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("unix socket: %v, %v; want mode 0660", fi.Mode(), err)
	}
	if (Peer{}).May(0) || (Peer{Any: true}).May(0) {
		t.Error("an unknown peer may attach")
	}
}

func TestProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:15F8":                         "127.0.0.1:5624",
		"00000000000000000000000001000000:0016": "[::1]:22",
		"0000000000000000FFFF00000100007F:0050": "[::ffff:127.0.0.1]:80",
	} {
		a, err := procAddr(in)
		if err != nil || a.String() != want {
			t.Errorf("procAddr(%q) = %v, %v; want %s", in, a, err, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007:15F8", "0100007F:xyz"} {
		if _, err := procAddr(bad); err == nil {
			t.Errorf("procAddr(%q) took it", bad)
		}
	}
}
