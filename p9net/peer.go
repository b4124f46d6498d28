package p9net

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Peer is who is at the other end of a connection, as the kernel or a key
// tells it, never as the client says: the uids it may attach as.
type Peer struct {
	// Any: it may attach as any uid. A root process of this machine (a
	// shale mount serving its users) or a holder of the host key, which
	// is trusted to say which of its machine's users acts, as NFS trusts
	// a client host with sec=sys.
	Any bool
	// UID is the only uid it may attach as, unless Any.
	UID uint32
	// Known is false when nothing could tell who it is: it may attach as
	// nobody at all.
	Known bool
	// Principal names it for the server's records: a journal made over
	// one connection is opened, and its delayed writes reclaimed, only
	// over connections of the same principal. No spaces.
	Principal string
	// How says how it was told, for messages ("unix socket peer", "user
	// key alice", ...).
	How string
}

// May tells whether p may attach as uid.
func (p Peer) May(uid uint32) bool {
	return p.Known && (p.Any || p.UID == uid)
}

func (p Peer) String() string {
	switch {
	case !p.Known:
		return "an unidentified peer (" + p.How + ")"
	case p.Any:
		return p.How + ", which may act as any user"
	}
	return fmt.Sprintf("%s, uid %d", p.How, p.UID)
}

// localPeer is the peer of a process of this machine with uid.
func localPeer(uid uint32, how string) Peer {
	return Peer{Any: uid == 0, UID: uid, Known: true, Principal: uidPrincipal(uid), How: how}
}

// uidPrincipal is the principal of a local user.
func uidPrincipal(uid uint32) string { return "uid:" + strconv.FormatUint(uint64(uid), 10) }

// PeerOf is who is at the other end of c, if c came from a listener of
// Listen; ok is false for any other connection, which the listener's
// owner vouches for.
func PeerOf(c any) (p Peer, ok bool) {
	if ic, ok := c.(interface{ Peer() Peer }); ok {
		return ic.Peer(), true
	}
	return Peer{}, false
}

// identConn is a connection of Listen's, with who is at its other end,
// found at the first ask (in the connection's goroutine, not Accept's).
type identConn struct {
	net.Conn
	once sync.Once
	find func() Peer
	peer Peer
}

func (c *identConn) Peer() Peer {
	c.once.Do(func() { c.peer = c.find() })
	return c.peer
}

// identify wraps a connection accepted without a key: a unix socket's
// peer is the kernel's SO_PEERCRED, a loopback TCP peer the owner of its
// socket (/proc/net/tcp, as identd finds it).
func identify(c net.Conn) net.Conn {
	return &identConn{Conn: c, find: func() Peer {
		switch c := c.(type) {
		case *net.UnixConn:
			uid, err := unixPeerUID(c)
			if err != nil {
				return Peer{How: "unix socket peer: SO_PEERCRED: " + err.Error()}
			}
			return localPeer(uid, "unix socket peer")
		case *net.TCPConn:
			uid, err := tcpPeerUID(c.RemoteAddr(), c.LocalAddr())
			if err != nil {
				return Peer{How: "TCP peer " + c.RemoteAddr().String() + ": " + err.Error()}
			}
			return localPeer(uid, "loopback TCP peer")
		}
		return Peer{How: "a connection of no known kind"}
	}}
}

func unixPeerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if gerr != nil {
		return 0, gerr
	}
	return cred.Uid, nil
}

// procNetTCP are the kernel's tables of TCP sockets (overridden by tests).
var procNetTCP = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// tcpPeerUID is the owner of the socket of this machine whose local
// address is remote and whose peer is local: the process that connected
// to us over loopback. Only an established socket counts (a closed one
// in TIME_WAIT belongs to nobody in particular).
func tcpPeerUID(remote, local net.Addr) (uint32, error) {
	r, err1 := netip.ParseAddrPort(remote.String())
	l, err2 := netip.ParseAddrPort(local.String())
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	if !r.Addr().Unmap().IsLoopback() {
		return 0, errors.New("not a loopback peer: no key, no way to tell who it is")
	}
	for _, p := range procNetTCP {
		uid, ok, err := scanTCP(p, r, l)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		if ok {
			return uid, nil
		}
	}
	return 0, errors.New("its socket is not in /proc/net/tcp (it closed?)")
}

// scanTCP looks for the established socket from r to l in the table p.
func scanTCP(p string, r, l netip.AddrPort) (uint32, bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan() // the heading
	for s.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid ...
		fs := strings.Fields(s.Text())
		if len(fs) < 8 || fs[3] != "01" {
			continue
		}
		la, err1 := procAddr(fs[1])
		ra, err2 := procAddr(fs[2])
		if err1 != nil || err2 != nil || !sameAddr(la, r) || !sameAddr(ra, l) {
			continue
		}
		uid, err := strconv.ParseUint(fs[7], 10, 32)
		if err != nil {
			return 0, false, fmt.Errorf("%s: uid %q: %v", p, fs[7], err)
		}
		return uint32(uid), true, nil
	}
	return 0, false, s.Err()
}

func sameAddr(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// procAddr parses an address of /proc/net/tcp{,6}: the address in hex as
// 32-bit words in the machine's order, a colon, the port in hex.
func procAddr(s string) (netip.AddrPort, error) {
	h, ps, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(ps, 16, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != 4 && len(b) != 16 {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.NativeEndian.Uint32(b[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a, uint16(port)), nil
}
