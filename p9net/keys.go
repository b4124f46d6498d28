package p9net

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Two kinds of key file. A host key is a secret of at least MinKeyLen
// bytes that the server and its trusted client machines share: it is the
// server's identity, and its holders may attach as any user (as NFS
// trusts a client host with sec=sys). A user key is one user's: an
// Ed25519 private key that never leaves its holder, whose public half the
// server lists (AuthorizedKeys) with the one user it may attach as, and
// the public key of the server it trusts (a client with a user key checks
// the server as much as the server checks it):
//
//	shale-user-key 1
//	user alice
//	secret BASE64 (the 32-byte seed)
//	server BASE64 (the server's public key: shale keygen --public HOSTKEY)
const userKeyMagic = "shale-user-key 1\n"

// userKey is a parsed user key file.
type userKey struct {
	user   string
	priv   ed25519.PrivateKey
	server ed25519.PublicKey
}

// isUserKey tells a user key file from a host key.
func (k Key) isUserKey() bool { return bytes.HasPrefix(k, []byte(userKeyMagic)) }

func (k Key) userKey() (*userKey, error) {
	u := &userKey{}
	for _, line := range strings.Split(strings.TrimPrefix(string(k), userKeyMagic), "\n") {
		f, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch f {
		case "user":
			u.user = v
		case "secret":
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil || len(b) != ed25519.SeedSize {
				return nil, errors.New("user key: its secret is not 32 bytes of base64")
			}
			u.priv = ed25519.NewKeyFromSeed(b)
		case "server":
			p, err := ParsePublic(v)
			if err != nil {
				return nil, fmt.Errorf("user key: server: %v", err)
			}
			u.server = p
		}
	}
	switch {
	case u.user == "":
		return nil, errors.New("user key: no user line")
	case u.priv == nil:
		return nil, errors.New("user key: no secret line")
	case u.server == nil:
		return nil, errors.New("user key: no server line: add 'server PUBLIC' (the output of shale keygen --public HOSTKEY on the server)")
	}
	return u, nil
}

// hostPair is the key pair a host key stands for: the server's identity.
func (k Key) hostPair() (ed25519.PrivateKey, error) {
	seed, err := hkdf.Key(sha256.New, k, nil, "shale 9p tls v1", ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// Public is the public half of a key file, as the other side lists it:
// a host key's is the server's (for user keys' server line), a user
// key's is what the server's AuthorizedKeys names.
func (k Key) Public() (string, error) {
	if k.isUserKey() {
		u, err := k.userKey()
		if err != nil {
			return "", err
		}
		return "ed25519 " + base64.StdEncoding.EncodeToString(u.priv.Public().(ed25519.PublicKey)) + " " + u.user, nil
	}
	priv, err := k.hostPair()
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)), nil
}

// ParsePublic parses a public key as Public gives it (the base64 alone).
func ParsePublic(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%q is no public key (32 bytes of base64)", s)
	}
	return ed25519.PublicKey(b), nil
}

// NewHostKey is a new host key file's contents.
func NewHostKey() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return []byte(base64.StdEncoding.EncodeToString(b) + "\n")
}

// NewUserKey is a new user key file's contents, for user, trusting the
// server of public key server.
func NewUserKey(user, server string) ([]byte, error) {
	if user == "" || strings.ContainsAny(user, " \t\n") {
		return nil, fmt.Errorf("user %q: say a user name or uid, without spaces", user)
	}
	if _, err := ParsePublic(server); err != nil {
		return nil, fmt.Errorf("server: %v", err)
	}
	seed := make([]byte, ed25519.SeedSize)
	rand.Read(seed)
	return fmt.Appendf(nil, "%suser %s\nsecret %s\nserver %s\n", userKeyMagic, user,
		base64.StdEncoding.EncodeToString(seed), strings.TrimSpace(server)), nil
}

// authorized is a server's list of user keys (AuthorizedKeys): lines of
// "ed25519 BASE64 USER", USER a name of the server's user database or a
// uid; '#' starts a comment. It is read again when it changes, so that a
// key removed is refused at the next connection.
type authorized struct {
	path string

	mu    sync.Mutex
	mtime time.Time
	size  int64
	keys  map[string]uint32 // public key (raw) → uid
	err   error
}

// uidOf is the uid the holder of pub may attach as.
func (a *authorized) uidOf(pub ed25519.PublicKey) (uint32, bool, error) {
	if a == nil {
		return 0, false, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	fi, err := os.Stat(a.path)
	if err != nil {
		return 0, false, fmt.Errorf("authorized keys: %v", err)
	}
	if a.keys == nil || !fi.ModTime().Equal(a.mtime) || fi.Size() != a.size {
		a.keys, a.err = readAuthorized(a.path, fi)
		a.mtime, a.size = fi.ModTime(), fi.Size()
	}
	if a.err != nil {
		return 0, false, a.err
	}
	uid, ok := a.keys[string(pub)]
	return uid, ok, nil
}

func readAuthorized(path string, fi os.FileInfo) (map[string]uint32, error) {
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("authorized keys %s may be written by others (mode %#o): chmod go-w %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %v", err)
	}
	keys := map[string]uint32{}
	for i, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 || f[0] != "ed25519" {
			return nil, fmt.Errorf("%s:%d: write 'ed25519 PUBLIC USER' (shale keygen --public USERKEY prints it)", path, i+1)
		}
		pub, err := ParsePublic(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, i+1, err)
		}
		uid, err := lookupUID(f[2])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, i+1, err)
		}
		keys[string(pub)] = uid
	}
	return keys, nil
}

// lookupUID is the uid of a user name, or a uid written as a number.
func lookupUID(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, fmt.Errorf("user %s: %v", s, err)
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("user %s: uid %q", s, u.Uid)
	}
	return uint32(n), nil
}

// CheckAuthorized reads an authorized keys file once, so that a bad one
// fails the command that names it.
func CheckAuthorized(path string) error {
	a := &authorized{path: path}
	_, _, err := a.uidOf(nil)
	return err
}
