package crypt

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/shalefs/shale/wrap"
)

// Extended attributes, from format version 2 on (the wrap hook
// XattrCodec). Each file that has any gets an identity, 16 random bytes in
// its lower attribute user.shale.xid. An attribute of the user.* or
// trusted.* namespace is stored as
//
//	name:  user.shale.x. || base64url-no-padding(AES-SIV-CMAC-512(xattr name key, AD = [identity], pad(name)))
//	value: nonce (12 random bytes) || AES-256-GCM(xattr value key, nonce, value, AD) || tag
//	AD:    "shale-crypt v2 xattr" || 16 (1 byte) || identity || len(name) (1 byte) || name
//
// where name is the whole name (user.comment) and pad is padName's (PKCS#7
// to a multiple of 16 bytes, as for file names). Names are deterministic,
// so getxattr needs no listing, and the identity makes equal names on two
// files look different below; the name in the value's AD makes a value
// moved to another name or file fail. Names of at most 159 bytes fit in a
// lower name (255 bytes). The key is one HKDF output split in two, 64
// bytes for SIV and 32 for GCM.
//
// security.* and system.* pass through in plain: the lower kernel acts on
// them (POSIX ACLs, which shale's permission checks rely on; LSM labels;
// file capabilities), which it could not once encrypted. Lower user.*
// attributes exist only on regular files and directories, so trusted.* on
// a symlink or a device fails (EPERM) through crypt. Version 1 directories
// keep every attribute in plain (xattrCodec).
const (
	infoXattrs      = "shale-crypt v2 xattrs" // 96 bytes: the name key, then the value key
	xattrIDName     = "user.shale.xid"
	xattrIDSize     = 16
	xattrNamePrefix = "user.shale.x."
	xattrNonceSize  = 12 // few are written: random 96-bit nonces keep well within GCM's bounds
	xattrOverhead   = xattrNonceSize + tagSize
	xattrADLabel    = "shale-crypt v2 xattr"
	xattrNameMax    = 255 // XATTR_NAME_MAX
)

var errXattrAuth = errors.New("not an extended attribute of this crypt layer on this file, or altered")

// xattrCodec is the layer as wrap's XattrCodec from format version 2 on;
// for version 1, a nil interface (not a nil *Layer in one), so attributes
// pass through in plain as they always did there.
func (l *Layer) xattrCodec() wrap.XattrCodec {
	if l.version < 2 {
		return nil
	}
	return l
}

// TakesXattr tells the namespaces that are encrypted.
func (l *Layer) TakesXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "trusted.")
}

func (l *Layer) XattrIDName() string { return xattrIDName }
func (l *Layer) XattrIDSize() int    { return xattrIDSize }

// NewXattrID makes a file's identity.
func (l *Layer) NewXattrID() ([]byte, error) {
	id := make([]byte, xattrIDSize)
	rand.Read(id) // never fails (crypto/rand panics on a broken kernel)
	return id, nil
}

// EncodeXattrName encrypts name for the file of identity id.
func (l *Layer) EncodeXattrName(id []byte, name string) (string, error) {
	if err := l.checkXattrName(name); err != nil {
		return "", err
	}
	sealed := l.xnames.seal(nil, [][]byte{id}, padName([]byte(name)))
	return xattrNamePrefix + nameEncoding.EncodeToString(sealed), nil
}

// DecodeXattrName decrypts and authenticates a lower name of the file of
// identity id. Names that are not this layer's fail, and the template
// hides them.
func (l *Layer) DecodeXattrName(id []byte, lower string) (string, error) {
	enc, ok := strings.CutPrefix(lower, xattrNamePrefix)
	if !ok {
		return "", errXattrAuth
	}
	sealed, err := nameEncoding.DecodeString(enc)
	if err != nil {
		return "", errXattrAuth
	}
	padded, err := l.xnames.open(nil, [][]byte{id}, sealed)
	if err != nil {
		return "", errXattrAuth
	}
	plain, err := unpadName(padded)
	if name := string(plain); err == nil && l.checkXattrName(name) == nil {
		return name, nil
	}
	// Authentic but not what EncodeXattrName makes: a format error.
	return "", errXattrAuth
}

// SealXattr encrypts the value of attribute name of the file of identity id.
func (l *Layer) SealXattr(id []byte, name string, value []byte) ([]byte, error) {
	if err := l.checkXattrName(name); err != nil {
		return nil, err
	}
	var nonce [xattrNonceSize]byte
	rand.Read(nonce[:]) // never fails (crypto/rand panics on a broken kernel)
	return l.sealXattr(nonce[:], id, name, value), nil
}

// sealXattr is SealXattr with the nonce given, for known-answer tests.
func (l *Layer) sealXattr(nonce, id []byte, name string, value []byte) []byte {
	dst := make([]byte, 0, xattrOverhead+len(value))
	return l.xvalues.Seal(append(dst, nonce...), nonce, value, xattrAD(id, name))
}

// OpenXattr authenticates and decrypts a stored value.
func (l *Layer) OpenXattr(id []byte, name string, stored []byte) ([]byte, error) {
	if len(stored) < xattrOverhead || l.checkXattrName(name) != nil {
		return nil, errXattrAuth
	}
	v, err := l.xvalues.Open(nil, stored[:xattrNonceSize], stored[xattrNonceSize:], xattrAD(id, name))
	if err != nil {
		return nil, errXattrAuth
	}
	return v, nil
}

// xattrAD binds a value to its file and name. Both lengths fit a byte
// (identities are 16 bytes, names at most 255: checkXattrName).
func xattrAD(id []byte, name string) []byte {
	ad := make([]byte, 0, len(xattrADLabel)+2+len(id)+len(name))
	ad = append(append(append(ad, xattrADLabel...), byte(len(id))), id...)
	return append(append(ad, byte(len(name))), name...)
}

// checkXattrName refuses what the layer would never store encrypted.
func (l *Layer) checkXattrName(name string) error {
	switch {
	case !l.TakesXattr(name):
		return fmt.Errorf("extended attribute %q is not in an encrypted namespace: %w", name, syscall.EINVAL)
	case strings.IndexByte(name, '.') == len(name)-1:
		return fmt.Errorf("extended attribute name %q is a namespace only: %w", name, syscall.EINVAL)
	case len(name) > xattrNameMax:
		return fmt.Errorf("extended attribute name of %d bytes, at most %d: %w", len(name), xattrNameMax, syscall.ERANGE)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("extended attribute name %q contains NUL: %w", name, syscall.EINVAL)
	}
	return nil
}
