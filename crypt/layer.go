package crypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/wrap"
)

// Layer is an open crypt file system: the ciphers keyed from its master
// key. It implements the wrap hooks BlockCodec, FileHeader, NameCodec,
// DirIDer and LinkCodec; all methods are safe for concurrent use
// (cipher.AEAD and cipher.Block are).
type Layer struct {
	content cipher.AEAD // AES-256-GCM, 16-byte nonces: file blocks
	names   *siv        // AES-SIV-CMAC-512: names
	links   cipher.AEAD // AES-256-GCM, 12-byte nonces: symlink targets
}

// Layer provides every hook crypt needs; a change in wrap's interfaces
// breaks the build here rather than silently dropping a hook.
var (
	_ wrap.BlockCodec = (*Layer)(nil)
	_ wrap.FileHeader = (*Layer)(nil)
	_ wrap.NameCodec  = (*Layer)(nil)
	_ wrap.DirIDer    = (*Layer)(nil)
	_ wrap.LinkCodec  = (*Layer)(nil)
)

// Stack builds the encrypted view over lower, the root of LOWER (the
// directory Open read the config from) as a layer.
func (l *Layer) Stack(ctx context.Context, lower layer.Node) (layer.Node, error) {
	return wrap.New(ctx, lower, l)
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
// once, so the hot path (EncodeBlock/DecodeBlock) only uses them.
func newLayer(master []byte) (*Layer, error) {
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
	defer clear(ck)
	defer clear(nk)
	defer clear(lk)
	l := &Layer{}
	if l.content, err = newGCM(ck, blockNonceSize); err != nil {
		return nil, err
	}
	if l.names, err = newSIV(nk); err != nil {
		return nil, err
	}
	if l.links, err = newGCM(lk, linkNonceSize); err != nil {
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
