package p9net

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os/user"
	"strconv"
	"strings"
	"sync"
)

// The 9P library (hugelgupf/p9 v0.3.0) drops Tattach's user on both sides:
// its client sends none, its server passes none to the file system. The
// stream rewriters here carry it through the attach name, the one field
// that reaches the server's file system: the client side turns
// ClientAname(uid, aname) into a Tattach with n_uname uid, and the server
// side turns every Tattach into one whose attach name starts with
// IdentityName(uid), which no client can send itself.

// NoUID is 9P's "no user given".
const NoUID = ^uint32(0)

// Nobody is the uid of users the server does not know.
const Nobody = 65534

const (
	msgTauth      = 102
	msgTattach    = 104
	headerLen     = 7
	maxAttachSize = 64 << 10 // a Tattach is four small fields
	identityMark  = "\x00uid:"
	// noAuth is an attach name no file system has (it holds a NUL).
	noAuth = "\x00no auth"
	noFid  = ^uint32(0)
)

// IdentityName is the attach name element that tells the server's file
// system which uid attaches. It holds a NUL, so no file name is one.
func IdentityName(uid uint32) string { return identityMark + strconv.FormatUint(uint64(uid), 10) }

// ParseIdentity reads an IdentityName.
func ParseIdentity(name string) (uid uint32, ok bool) {
	s, ok := strings.CutPrefix(name, identityMark)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// ClientAname is the attach name to give the library's Client.Attach on a
// ClientStream connection to attach as uid.
func ClientAname(uid uint32, aname string) string { return IdentityName(uid) + "/" + aname }

// attach is a Tattach's body.
type attach struct {
	fid, afid    uint32
	uname, aname string
	nuname       uint32
}

func parseAttach(b []byte) (a attach, err error) {
	bad := errors.New("malformed Tattach")
	str := func() string {
		if len(b) < 2 {
			err = bad
			return ""
		}
		n := int(binary.LittleEndian.Uint16(b))
		if len(b) < 2+n {
			err = bad
			return ""
		}
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s
	}
	if len(b) < 8 {
		return a, bad
	}
	a.fid, a.afid = binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	b = b[8:]
	a.uname = str()
	a.aname = str()
	if err != nil || len(b) != 4 {
		return a, bad
	}
	a.nuname = binary.LittleEndian.Uint32(b)
	return a, nil
}

// frame encodes a as a whole message with tag.
func (a attach) frame(tag uint16) []byte {
	n := headerLen + 8 + 2 + len(a.uname) + 2 + len(a.aname) + 4
	b := make([]byte, 0, n)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = append(b, msgTattach)
	b = binary.LittleEndian.AppendUint16(b, tag)
	b = binary.LittleEndian.AppendUint32(b, a.fid)
	b = binary.LittleEndian.AppendUint32(b, a.afid)
	for _, s := range []string{a.uname, a.aname} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return binary.LittleEndian.AppendUint32(b, a.nuname)
}

// rewrite returns the frame that replaces the Tattach frame f, or f itself
// when it cannot be read (the library then answers it with an error).
func rewrite(f []byte, change func(*attach)) []byte {
	a, err := parseAttach(f[headerLen:])
	if err != nil {
		return f
	}
	change(&a)
	if len(a.uname) > 0xffff || len(a.aname) > 0xffff {
		return f
	}
	return a.frame(binary.LittleEndian.Uint16(f[5:]))
}

// authAsAttach turns a Tauth into a Tattach of its afid that fails with
// ENOENT, without effects: hugelgupf/p9 answers Tauth with ENOSYS, where
// clients (diod's, the kernel's) take only ENOENT for "no authentication
// needed". Authentication, when configured, is TLS, before any message.
func authAsAttach(f []byte) []byte {
	body := make([]byte, 4, len(f)-headerLen+4)
	binary.LittleEndian.PutUint32(body, noFid)
	a, err := parseAttach(append(body, f[headerLen:]...))
	if err != nil {
		return f
	}
	a.fid, a.afid, a.aname = a.afid, noFid, noAuth
	return a.frame(binary.LittleEndian.Uint16(f[5:]))
}

// serverIdentity makes the attach name carry who attaches: n_uname, or the
// uname in the user database, or Nobody.
func serverIdentity(a *attach) {
	uid := a.nuname
	if uid == NoUID {
		uid = Nobody
		if u, err := user.Lookup(a.uname); err == nil {
			if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
				uid = uint32(n)
			}
		}
	}
	name := IdentityName(uid)
	if rest := strings.Trim(a.aname, "/"); rest != "" {
		name += "/" + rest
	}
	a.aname = name
}

// clientIdentity turns ClientAname's attach name into n_uname.
func clientIdentity(a *attach) {
	first, rest, _ := strings.Cut(a.aname, "/")
	if uid, ok := ParseIdentity(first); ok {
		a.nuname, a.aname = uid, rest
		if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			a.uname = u.Username
		}
	}
}

// ServerStream returns rc's 9P messages with every Tattach rewritten by
// serverIdentity and every Tauth by authAsAttach; other messages pass
// unchanged and uncopied.
func ServerStream(rc io.ReadCloser) io.ReadCloser {
	// Buffered: the header is read apart from the rest.
	return &attachReader{rc: rc, r: bufio.NewReaderSize(rc, 64<<10)}
}

type attachReader struct {
	rc      io.ReadCloser
	r       *bufio.Reader
	out     []byte // rewritten or header bytes not yet read
	passing int64  // bytes of the current message still to pass through
	broken  bool   // not 9P framing: pass everything through
}

func (r *attachReader) Close() error { return r.rc.Close() }

func (r *attachReader) Read(p []byte) (int, error) {
	if len(r.out) > 0 {
		n := copy(p, r.out)
		r.out = r.out[n:]
		return n, nil
	}
	if r.passing > 0 || r.broken {
		if !r.broken && int64(len(p)) > r.passing {
			p = p[:r.passing]
		}
		n, err := r.r.Read(p)
		r.passing -= int64(n)
		return n, err
	}
	hdr := make([]byte, 5, headerLen)
	if _, err := io.ReadFull(r.r, hdr); err != nil {
		return 0, err
	}
	size := int64(binary.LittleEndian.Uint32(hdr))
	switch {
	case (hdr[4] == msgTattach || hdr[4] == msgTauth) && size >= headerLen && size <= maxAttachSize:
		f := make([]byte, size)
		copy(f, hdr)
		if _, err := io.ReadFull(r.r, f[5:]); err != nil {
			return 0, err
		}
		if hdr[4] == msgTauth {
			// Not given an identity: the server's attach root then
			// has no such name (ENOENT).
			r.out = authAsAttach(f)
		} else {
			r.out = rewrite(f, serverIdentity)
		}
	case size < 5:
		// The library rejects it and ends the connection.
		r.out, r.broken = hdr, true
	default:
		r.out, r.passing = hdr, size-5
	}
	return r.Read(p)
}

// ClientStream returns c as a connection for the library's client on which
// ClientAname attach names send their uid (clientIdentity).
func ClientStream(c net.Conn) io.ReadWriteCloser { return &attachWriter{Conn: c} }

// attachWriter sees the client's messages as the library writes them, in
// pieces but one message after another (it holds its send lock). It sends
// each message in one write, but for large payloads, which go as they come.
type attachWriter struct {
	net.Conn
	mu      sync.Mutex
	out     []byte // the message so far, unsent
	attach  bool   // the message is a Tattach: gather it whole
	passing int64  // bytes of the message still to come, once its type is known
}

// bigWrite is the piece size sent at once rather than gathered.
const bigWrite = 32 << 10

func (w *attachWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	total := len(p)
	for len(p) > 0 {
		if w.passing == 0 {
			// The header: gather until the size and type are known.
			n := min(len(p), 5-len(w.out))
			w.out = append(w.out, p[:n]...)
			p = p[n:]
			if len(w.out) < 5 {
				continue
			}
			size := int64(binary.LittleEndian.Uint32(w.out))
			w.attach = w.out[4] == msgTattach && size >= headerLen && size <= maxAttachSize
			w.passing = size - 5
			if w.passing <= 0 {
				// Not 9P: nothing the library sends; pass it on.
				w.passing = 0
				if err := w.flush(); err != nil {
					return 0, err
				}
			}
			continue
		}
		n := min(int64(len(p)), w.passing)
		if n >= bigWrite && !w.attach {
			if err := w.flush(); err != nil {
				return 0, err
			}
			if _, err := w.Conn.Write(p[:n]); err != nil {
				return 0, err
			}
		} else {
			w.out = append(w.out, p[:n]...)
		}
		w.passing -= n
		p = p[n:]
		if w.passing == 0 {
			if w.attach {
				w.out = rewrite(w.out, clientIdentity)
			}
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

func (w *attachWriter) flush() error {
	_, err := w.Conn.Write(w.out)
	w.out = w.out[:0]
	return err
}
