package crypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
	"github.com/shalefs/shale/wrap"
)

// Layer is an open crypt file system: the ciphers keyed from its master
// key. It implements the wrap hooks BlockCodec, FileHeader, NameCodec,
// DirIDer, LinkCodec and (format 2) XattrCodec, which Stack gives to wrap
// by name; all methods are safe for concurrent use (cipher.AEAD and
// cipher.Block are).
type Layer struct {
	content cipher.AEAD // AES-256-GCM, 16-byte nonces: file blocks
	names   *siv        // AES-SIV-CMAC-512: names
	links   cipher.AEAD // AES-256-GCM, 12-byte nonces: symlink targets
	xnames  *siv        // AES-SIV-CMAC-512: extended attribute names (xattr.go)
	xvalues cipher.AEAD // AES-256-GCM, 12-byte nonces: extended attribute values

	// version is the directory's format (shale.conf): from 2 on, names
	// are padded and extended attributes encrypted.
	version int
	// fillHoles makes every block of every file stored encrypted: no
	// all-zero block reads as a hole (shale init --no-holes).
	fillHoles bool
}

// Stack builds the encrypted view over lower, the root of LOWER (the
// directory Open read the config from), as a layer of st.
func (l *Layer) Stack(ctx context.Context, st *stack.Stack, lower layer.Node) (layer.Node, error) {
	return wrap.New(ctx, st, lower, wrap.Hooks{Blocks: l, Header: l, Names: l, Dirs: l, Links: l, Xattrs: l.xattrCodec(), FillHoles: l.fillHoles})
}

func init() {
	stack.Register(stack.Kind{
		Name:    "crypt",
		Short:   "encrypt data, names and symlinks (needs shale init --layer crypt LOWER first)",
		Options: map[string]string{"passfile": "read the passphrase from the first line of this file (default: ask)"},
		// The passphrase is asked for, and checked, where the user can
		// answer: before a mount goes to the background.
		Prepare: func(p stack.Prep) ([]byte, error) {
			if p.Passphrase == nil {
				return nil, fmt.Errorf("crypt over %s needs its passphrase", p.Dir)
			}
			pass, err := p.Passphrase(p.Layer.Options["passfile"], "passphrase for "+p.Dir)
			if err != nil {
				return nil, err
			}
			if _, err := openLower(context.Background(), p.Dir, pass); err != nil {
				return nil, err
			}
			return pass, nil
		},
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, sl stack.Layer) (layer.Node, error) {
			l, err := openLower(ctx, dir, sl.Secret)
			if err != nil {
				return nil, err
			}
			return l.Stack(ctx, st, lower)
		},
	})
}

// openLower is Open of LOWER, called dir, through a root of its own: the
// config is at the bottom of the stack, where a layer between it and crypt
// would hide or rename it.
func openLower(ctx context.Context, dir string, pass []byte) (l *Layer, err error) {
	err = stack.UseLower(dir, func(root layer.Node) error {
		l, err = Open(ctx, root, dir, pass)
		return err
	})
	return l, err
}

// masterKeySize is the size of the random master key kept in shale.conf.
const masterKeySize = 32

// HKDF-SHA256 info strings, one per subkey, so no key ever serves two
// purposes and a future format version can derive fresh ones.
const (
	infoContent = "shale-crypt v1 content"
	infoNames   = "shale-crypt v1 names"
	infoLinks   = "shale-crypt v1 links"
)

// newLayer derives the subkeys from the master key and builds the ciphers
// once, so the hot path (EncodeBlock/DecodeBlock) only uses them; version
// is the directory's format.
func newLayer(master []byte, version int) (*Layer, error) {
	if len(master) != masterKeySize {
		return nil, fmt.Errorf("master key is %d bytes, want %d", len(master), masterKeySize)
	}
	ck, err := hkdf.Key(sha256.New, master, nil, infoContent, 32)
	if err != nil {
		return nil, err
	}
	nk, err := hkdf.Key(sha256.New, master, nil, infoNames, 64)
	if err != nil {
		return nil, err
	}
	lk, err := hkdf.Key(sha256.New, master, nil, infoLinks, 32)
	if err != nil {
		return nil, err
	}
	xk, err := hkdf.Key(sha256.New, master, nil, infoXattrs, 64+32)
	if err != nil {
		return nil, err
	}
	defer clear(ck)
	defer clear(nk)
	defer clear(lk)
	defer clear(xk)
	l := &Layer{version: version}
	if l.content, err = newGCM(ck, blockNonceSize); err != nil {
		return nil, err
	}
	if l.names, err = newSIV(nk); err != nil {
		return nil, err
	}
	if l.links, err = newGCM(lk, linkNonceSize); err != nil {
		return nil, err
	}
	if l.xnames, err = newSIV(xk[:64]); err != nil {
		return nil, err
	}
	if l.xvalues, err = newGCM(xk[64:], xattrNonceSize); err != nil {
		return nil, err
	}
	return l, nil
}

func newGCM(key []byte, nonceSize int) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	if nonceSize == 12 {
		return cipher.NewGCM(b)
	}
	return cipher.NewGCMWithNonceSize(b, nonceSize)
}
