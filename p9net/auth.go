package p9net

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
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

// ListenOptions bound the connections a keyed listener has accepted but
// not yet authenticated.
type ListenOptions struct {
	// HandshakeTimeout bounds a connection's TLS handshake (0:
	// DefaultAcceptTimeout).
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the handshakes under way (0: 128); past it the
	// oldest of the peer with the most is closed (Pending).
	MaxHandshakes int
}

// DefaultAcceptTimeout is how long a server gives a new connection to
// authenticate, and then to send its first 9P message: a few seconds,
// plenty for a client that means to, short for one that holds a slot.
const DefaultAcceptTimeout = 5 * time.Second

// LoadKey reads a key file: at least MinKeyLen bytes (a final newline is
// not part of it), readable by its owner only, like an ssh key.
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
	if len(b) < MinKeyLen {
		return nil, fmt.Errorf("key file %s holds %d bytes, fewer than %d: make one with 'head -c 32 /dev/urandom | base64 > %s'", path, len(b), MinKeyLen, path)
	}
	return Key(b), nil
}

// tlsConfig is the configuration both sides use: the certificate of the
// key pair derived from k, and a check that the peer shows the same.
func (k Key) tlsConfig() (*tls.Config, error) {
	seed, err := hkdf.Key(sha256.New, k, nil, "shale 9p tls v1", ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	priv := ed25519.NewKeyFromSeed(seed)
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
		// The peer is trusted for holding the key, not for a name: the
		// usual chain checks do not apply, the pinned key does.
		InsecureSkipVerify: true,
		ServerName:         "shale",
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) != 1 {
				return errors.New("peer shows no single certificate")
			}
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			if p, ok := c.PublicKey.(ed25519.PublicKey); !ok || !p.Equal(pub) {
				return errors.New("peer holds another key")
			}
			return nil
		},
	}, nil
}

// Listen listens on a, with the default ListenOptions.
func Listen(a Addr, key Key) (net.Listener, error) { return ListenWith(a, key, ListenOptions{}) }

// ListenWith listens on a. With a key, Accept gives only connections that
// have authenticated (TLS), each within o.HandshakeTimeout: one that
// cannot never takes a server's connection slot; it is logged and closed.
// A unix socket left by a dead server is replaced; one a live server
// answers on is not.
func ListenWith(a Addr, key Key, o ListenOptions) (net.Listener, error) {
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultAcceptTimeout
	}
	if o.MaxHandshakes <= 0 {
		o.MaxHandshakes = maxHandshakes
	}
	if a.Network == "unix" {
		if err := os.MkdirAll(filepath.Dir(a.Address), 0o755); err != nil {
			return nil, fmt.Errorf("listen on %s: %v", a, err)
		}
		if c, err := net.Dial("unix", a.Address); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen on %s: a server already answers there: stop it or choose another path", a)
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			os.Remove(a.Address)
		}
	}
	l, err := net.Listen(a.Network, a.Address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %v", a, err)
	}
	if key == nil {
		return l, nil
	}
	cfg, err := key.tlsConfig()
	if err != nil {
		l.Close()
		return nil, err
	}
	tl := &tlsListener{Listener: l, cfg: cfg, ready: make(chan net.Conn), done: make(chan struct{}),
		timeout: o.HandshakeTimeout, shaking: NewPending(o.MaxHandshakes)}
	go tl.run()
	return tl, nil
}

// maxHandshakes is the default bound of the connections authenticating at
// once.
const maxHandshakes = 128

type tlsListener struct {
	net.Listener
	cfg     *tls.Config
	ready   chan net.Conn // authenticated connections
	done    chan struct{} // closed by Close
	timeout time.Duration
	shaking *Pending // the handshakes under way
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
		done := l.shaking.Add(Peer(c), func() {
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
	select {
	case l.ready <- tc:
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
	cfg, err := key.tlsConfig()
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
