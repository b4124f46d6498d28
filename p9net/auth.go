package p9net

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"sync"
	"time"
)

// Key is the secret an export and its clients share.
type Key []byte

// MinKeyLen is the shortest key accepted: the public key that TLS shows
// would otherwise allow guessing it offline.
const MinKeyLen = 16

// ErrAuth is wrapped by every failure to authenticate.
var ErrAuth = errors.New("authentication failed")

// HandshakeTimeout bounds how long a client waits to authenticate.
const HandshakeTimeout = 10 * time.Second

// DefaultAcceptTimeout is how long a server gives a new connection to
// authenticate, and then to send its first 9P message: a few seconds,
// plenty for a client that means to, short for one that holds a slot.
const DefaultAcceptTimeout = 5 * time.Second

// LoadKey reads a key file, readable by its owner only, like an ssh key:
// a host key (at least MinKeyLen bytes; a final newline is not part of
// it) or a user key (keys.go).
func LoadKey(path string) (Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %v", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key file %s is readable by others (mode %#o): chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %v", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	if k := Key(b); k.isUserKey() {
		if _, err := k.userKey(); err != nil {
			return nil, fmt.Errorf("key file %s: %v", path, err)
		}
		return k, nil
	}
	if len(b) < MinKeyLen {
		return nil, fmt.Errorf("key file %s holds %d bytes, fewer than %d: make one with 'shale keygen %s'", path, len(b), MinKeyLen, path)
	}
	return Key(b), nil
}

// serverConfig is the server's TLS configuration: the certificate of
// the host key's pair, and a check that the client shows the same, or a
// user key that auth lists.
func (k Key) serverConfig(auth *authorized) (*tls.Config, error) {
	priv, err := k.hostPair()
	if err != nil {
		return nil, err
	}
	pub := priv.Public().(ed25519.PublicKey)
	return tlsConfig(priv, func(p ed25519.PublicKey) error {
		if p.Equal(pub) {
			return nil
		}
		if _, ok, err := auth.uidOf(p); err != nil || !ok {
			return errors.Join(errors.New("peer holds another key"), err)
		}
		return nil
	})
}

// clientConfig is a client's: with a host key, the same pair as the
// server's; with a user key, the user's pair, and the server must show
// the public key the user key trusts.
func (k Key) clientConfig() (*tls.Config, error) {
	if k.isUserKey() {
		u, err := k.userKey()
		if err != nil {
			return nil, err
		}
		return tlsConfig(u.priv, func(p ed25519.PublicKey) error {
			if !p.Equal(u.server) {
				return errors.New("the server is not the one the user key trusts (its server line)")
			}
			return nil
		})
	}
	priv, err := k.hostPair()
	if err != nil {
		return nil, err
	}
	pub := priv.Public().(ed25519.PublicKey)
	return tlsConfig(priv, func(p ed25519.PublicKey) error {
		if !p.Equal(pub) {
			return errors.New("peer holds another key")
		}
		return nil
	})
}

// tlsConfig shows the self-signed certificate of priv and takes a peer
// whose single certificate's key ok accepts.
func tlsConfig(priv ed25519.PrivateKey, ok func(ed25519.PublicKey) error) (*tls.Config, error) {
	pub := priv.Public().(ed25519.PublicKey)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"shale"},
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
		ClientAuth:   tls.RequireAnyClientCert,
		// The peer is trusted for holding a key, not for a name: the
		// usual chain checks do not apply, the pinned keys do.
		InsecureSkipVerify: true,
		ServerName:         "shale",
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			p, err := peerKey(raw)
			if err != nil {
				return err
			}
			return ok(p)
		},
	}, nil
}

// peerKey is the public key of a peer's single certificate.
func peerKey(raw [][]byte) (ed25519.PublicKey, error) {
	if len(raw) != 1 {
		return nil, errors.New("peer shows no single certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, err
	}
	p, ok := c.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, errors.New("peer shows no Ed25519 key")
	}
	return p, nil
}

// ListenConfig says how a server listens and who may connect.
type ListenConfig struct {
	// Key is the host key: the server's identity, and a secret shared
	// with trusted client machines (they may attach as any user). With
	// none, the peer must be a process of this machine, known by the
	// kernel: its uid is the one it may attach as (any, for root).
	Key Key
	// AuthorizedKeys, with a Key, is a file of user keys' public halves,
	// each with the one user its holder may attach as.
	AuthorizedKeys string
	// SocketMode is a unix socket's mode (0: 0660), SocketGID its group
	// if positive (else the server's).
	SocketMode os.FileMode
	SocketGID  int
	// HandshakeTimeout bounds a connection's TLS handshake, with a Key
	// (0: DefaultAcceptTimeout).
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the handshakes under way (0: 128); past it the
	// oldest of the peer with the most is closed (Pending).
	MaxHandshakes int
}

// Listen listens on a with the host key key alone (nil: none).
func Listen(a Addr, key Key) (net.Listener, error) { return ListenConfig{Key: key}.Listen(a) }

// Listen listens on a. Every connection Accept gives says who is at its
// other end (PeerOf). With a key, Accept gives only connections that
// have authenticated (TLS), each within lc.HandshakeTimeout: one that
// cannot never takes a server's connection slot; it is logged and closed.
func (lc ListenConfig) Listen(a Addr) (net.Listener, error) {
	if lc.HandshakeTimeout <= 0 {
		lc.HandshakeTimeout = DefaultAcceptTimeout
	}
	if lc.MaxHandshakes <= 0 {
		lc.MaxHandshakes = maxHandshakes
	}
	if lc.Key.isUserKey() {
		return nil, errors.New("a user key is a client's: a server takes a host key (shale keygen FILE)")
	}
	if lc.AuthorizedKeys != "" {
		if lc.Key == nil {
			return nil, errors.New("authorized keys need a host key (--keyfile): the server's identity, which user keys trust")
		}
		if err := CheckAuthorized(lc.AuthorizedKeys); err != nil {
			return nil, err
		}
	}
	var l net.Listener
	var err error
	if a.Network == "unix" {
		l, err = lc.listenUnix(a)
	} else if l, err = net.Listen(a.Network, a.Address); err != nil {
		err = fmt.Errorf("listen on %s: %v", a, err)
	}
	if err != nil {
		return nil, err
	}
	if lc.Key == nil {
		return identListener{l}, nil
	}
	var auth *authorized
	if lc.AuthorizedKeys != "" {
		auth = &authorized{path: lc.AuthorizedKeys}
	}
	cfg, err := lc.Key.serverConfig(auth)
	if err != nil {
		l.Close()
		return nil, err
	}
	priv, _ := lc.Key.hostPair()
	tl := &tlsListener{Listener: l, cfg: cfg, host: priv.Public().(ed25519.PublicKey), auth: auth,
		ready: make(chan net.Conn), done: make(chan struct{}),
		timeout: lc.HandshakeTimeout, shaking: NewPending(lc.MaxHandshakes)}
	go tl.run()
	return tl, nil
}

// identListener gives connections that say who is at their other end.
type identListener struct{ net.Listener }

func (l identListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return identify(c), nil
}

// peerOf is who an authenticated connection's key says it is.
func (l *tlsListener) peerOf(tc *tls.Conn) Peer {
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) != 1 {
		return Peer{How: "TLS peer without a certificate"}
	}
	p, ok := certs[0].PublicKey.(ed25519.PublicKey)
	switch {
	case !ok:
	case p.Equal(l.host):
		return Peer{Any: true, Known: true, Principal: "hostkey", How: "host key holder " + tc.RemoteAddr().String()}
	default:
		uid, ok, err := l.auth.uidOf(p)
		if err == nil && ok {
			fp := sha256.Sum256(p)
			return Peer{UID: uid, Known: true, Principal: "key:" + base64.RawURLEncoding.EncodeToString(fp[:12]),
				How: "user key " + base64.StdEncoding.EncodeToString(p)[:12] + "… holder " + tc.RemoteAddr().String()}
		}
	}
	return Peer{How: "TLS peer with a key no longer listed"}
}

// maxHandshakes is the default bound of the connections authenticating at
// once.
const maxHandshakes = 128

type tlsListener struct {
	net.Listener
	cfg     *tls.Config
	host    ed25519.PublicKey // the host key's: its holders may act as anyone
	auth    *authorized       // user keys, or nil
	ready   chan net.Conn     // authenticated connections
	done    chan struct{}     // closed by Close
	timeout time.Duration     // of a handshake
	shaking *Pending          // the handshakes under way
	once    sync.Once
	mu      sync.Mutex
	err     error // why the accept loop ended
}

func (l *tlsListener) run() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.Close()
			return
		}
		done := l.shaking.Add(PeerKey(c), func() {
			slog.Warn("9p: too many connections authenticating; closing the oldest", "remote", c.RemoteAddr().String())
			c.Close()
		})
		go l.handshake(c, done)
	}
}

func (l *tlsListener) handshake(c net.Conn, done func()) {
	defer done()
	tc := tls.Server(c, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		slog.Warn("9p: a client failed to authenticate", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	p := l.peerOf(tc)
	select {
	case l.ready <- &identConn{Conn: tc, find: func() Peer { return p }}:
	case <-l.done:
		tc.Close()
	}
}

func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *tlsListener) Close() error {
	var err error
	l.once.Do(func() {
		err = l.Listener.Close()
		close(l.done)
	})
	return err
}

// Dial connects to a; with a key, it authenticates before it returns.
func Dial(ctx context.Context, a Addr, key Key) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, a.Network, a.Address)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", a, err)
	}
	if key == nil {
		return c, nil
	}
	cfg, err := key.clientConfig()
	if err != nil {
		c.Close()
		return nil, err
	}
	tc := tls.Client(c, cfg)
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w with %s: %v: the server holds another key, or none (check --keyfile on both sides)", ErrAuth, a, err)
	}
	return tc, nil
}
