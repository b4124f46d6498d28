package crypt

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/crypto/scrypt"

	"github.com/shalefs/shale/layer"
)

// ConfigName is the file in LOWER that holds the wrapped master key.
const ConfigName = "shale.conf"

// config is shale.conf: the master key, wrapped by AES-256-GCM under a key
// derived from the passphrase with scrypt. JSON encodes the byte fields in
// standard base64. See docs/crypt-format.md.
type config struct {
	Format  string `json:"format"`  // configFormat
	Version int    `json:"version"` // 1 or configVersion
	// FillHoles (version 2 on) stores every block encrypted, so that no
	// all-zero block reads as a hole; bound into the wrapped key's tag.
	FillHoles  bool      `json:"fill_holes,omitempty"`
	KDF        kdfParams `json:"kdf"`
	Nonce      []byte    `json:"nonce"`       // 12 bytes
	WrappedKey []byte    `json:"wrapped_key"` // 32-byte master key + 16-byte tag
	// Checksum is the hex SHA-256 of wrapAD || Nonce || WrappedKey. It is
	// not a defence (anyone can recompute it); it lets a damaged file be
	// told apart from a wrong passphrase. Tampering is caught by the AD.
	Checksum string `json:"checksum"`
}

type kdfParams struct {
	Name string `json:"name"` // "scrypt"
	LogN int    `json:"log_n"`
	R    int    `json:"r"`
	P    int    `json:"p"`
	Salt []byte `json:"salt"` // 32 bytes
}

const (
	configFormat  = "shale-crypt"
	configVersion = 2 // what Init writes; version 1 is still read
	kdfScrypt     = "scrypt"
	saltSize      = 32
	wrapNonceSize = 12

	// DefaultScryptLogN makes scrypt take 64 MiB and about 0.2 s.
	DefaultScryptLogN = 16
	minInitLogN       = 10
	maxInitLogN       = 20
	// maxScryptMem bounds what a config may make Open spend (128·r·N
	// bytes), so a damaged or hostile config cannot exhaust memory.
	maxScryptMem = 1 << 30
)

// Errors that callers tell apart with errors.Is.
var (
	ErrWrongPassphrase = errors.New("wrong passphrase")
	ErrNoConfig        = errors.New("not a crypt directory")
	ErrInitialised     = errors.New("already a crypt directory")
	ErrNotEmpty        = errors.New("not empty")
	ErrDamaged         = errors.New("damaged")
)

// Options tune Init.
type Options struct {
	// ScryptLogN is log2 of scrypt's cost parameter N; 0 means
	// DefaultScryptLogN. r is 8 and p is 1.
	ScryptLogN int
	// Force allows a LOWER that already holds files. They stay as they
	// are and are hidden from the view, since their names do not decode.
	Force bool
	// FillHoles stores every block encrypted: growing a file or filling
	// a hole writes encrypted zeros, so that someone who can write LOWER
	// cannot make a file read zeros. Sparse files then take their full
	// size on disk.
	FillHoles bool
}

// The functions below take LOWER as the root of its backend (lower), so
// that a remote LOWER keeps its config too, and its name as given by the
// user (a directory or a URL), for messages.

// Init makes lower a crypt directory: a new random master key, wrapped
// under pass, written to lower/shale.conf. It refuses a directory that is
// already one, and one that is not empty unless opts.Force.
func Init(ctx context.Context, lower layer.Node, name string, pass []byte, opts Options) error {
	logN := opts.ScryptLogN
	if logN == 0 {
		logN = DefaultScryptLogN
	}
	if logN < minInitLogN || logN > maxInitLogN {
		return fmt.Errorf("scrypt cost 2^%d is out of range: choose log N from %d to %d", logN, minInitLogN, maxInitLogN)
	}
	if len(pass) == 0 {
		return errors.New("empty passphrase: choose a passphrase of at least one character")
	}
	path := lowerPath(name, ConfigName)
	var a layer.Attr
	if n, e := lower.Lookup(ctx, ConfigName, &a); e == 0 {
		n.Forget()
		return fmt.Errorf("%s exists: %s is %w; change its passphrase with 'shale passwd %s'", path, name, ErrInitialised, name)
	}
	entries, err := layer.ReadDirNames(ctx, lower)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, inLower(name, err))
	}
	if len(entries) > 0 && !opts.Force {
		return fmt.Errorf("%s is %w: initialise an empty directory, or pass --force to keep the files there (they stay unencrypted and hidden)", name, ErrNotEmpty)
	}
	master := make([]byte, masterKeySize)
	rand.Read(master) // never fails (crypto/rand panics on a broken kernel)
	defer clear(master)
	kdf := kdfParams{Name: kdfScrypt, LogN: logN, R: 8, P: 1, Salt: make([]byte, saltSize)}
	rand.Read(kdf.Salt)
	nonce := make([]byte, wrapNonceSize)
	rand.Read(nonce)
	c := &config{Format: configFormat, Version: configVersion, FillHoles: opts.FillHoles, KDF: kdf, Nonce: nonce}
	if err := c.wrap(master, pass); err != nil {
		return err
	}
	// The root directory's ID first: a config marks a finished init, and
	// a root without its ID is refused at mount (checkRootID).
	id, _ := (&Layer{}).NewDirID()
	if err := layer.WriteFileAtomic(ctx, lower, dirIDName, id, 0o444, true); err != nil {
		return fmt.Errorf("write the root directory's ID: %w", inLower(name, err))
	}
	return writeConfig(ctx, lower, name, c, false)
}

// Open reads lower/shale.conf, unwraps the master key with pass and
// returns the layer keyed from it.
func Open(ctx context.Context, lower layer.Node, name string, pass []byte) (*Layer, error) {
	c, path, err := readConfig(ctx, lower, name)
	if err != nil {
		return nil, err
	}
	master, err := c.unwrap(pass, path)
	if err != nil {
		return nil, err
	}
	defer clear(master)
	if err := checkRootID(ctx, lower, name); err != nil {
		return nil, err
	}
	l, err := newLayer(master, c.Version)
	if err != nil {
		return nil, err
	}
	l.fillHoles = c.FillHoles
	return l, nil
}

// Check tells whether lower is a crypt directory with a sound config,
// without a passphrase.
func Check(ctx context.Context, lower layer.Node, name string) error {
	_, _, err := readConfig(ctx, lower, name)
	return err
}

// ChangePassphrase rewraps the master key of lower under newPass. The
// files are untouched: only shale.conf changes, atomically (a new file,
// synced, renamed over the old one).
func ChangePassphrase(ctx context.Context, lower layer.Node, name string, oldPass, newPass []byte) error {
	if len(newPass) == 0 {
		return errors.New("empty new passphrase: choose a passphrase of at least one character")
	}
	c, path, err := readConfig(ctx, lower, name)
	if err != nil {
		return err
	}
	master, err := c.unwrap(oldPass, path)
	if err != nil {
		return err
	}
	defer clear(master)
	// The format stays; only the wrapping is new.
	nc := *c
	nc.KDF.Salt = make([]byte, saltSize)
	rand.Read(nc.KDF.Salt)
	nc.Nonce = make([]byte, wrapNonceSize)
	rand.Read(nc.Nonce)
	if err := nc.wrap(master, newPass); err != nil {
		return err
	}
	return writeConfig(ctx, lower, name, &nc, true)
}

// wrap seals master into c under the key scrypt derives from pass, with
// c's KDF parameters, nonce, version and flags.
func (c *config) wrap(master, pass []byte) error {
	aead, err := c.KDF.aead(pass)
	if err != nil {
		return err
	}
	c.WrappedKey = aead.Seal(nil, c.Nonce, master, c.wrapAD())
	c.Checksum = c.checksum()
	return nil
}

// unwrap recovers the master key; path names the config in errors.
func (c *config) unwrap(pass []byte, path string) ([]byte, error) {
	aead, err := c.KDF.aead(pass)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	master, err := aead.Open(nil, c.Nonce, c.WrappedKey, c.wrapAD())
	if err != nil {
		return nil, fmt.Errorf("%w for %s", ErrWrongPassphrase, path)
	}
	return master, nil
}

// aead is AES-256-GCM keyed with scrypt(pass, salt).
func (k *kdfParams) aead(pass []byte) (cipher.AEAD, error) {
	kek, err := scrypt.Key(pass, k.Salt, 1<<k.LogN, k.R, k.P, 32)
	if err != nil {
		return nil, fmt.Errorf("scrypt: %w", err)
	}
	defer clear(kek)
	b, err := aes.NewCipher(kek)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// wrapAD binds the format version, its flags and every parameter of the
// key derivation into the wrapped key's tag: a config with any of them
// changed (a version lowered to drop a protection, say) fails to open.
//
//	"shale-crypt vV scrypt" || 0x00 || log N (1 byte) || r (4 bytes BE) || p (4 bytes BE) || salt [|| flags (1 byte), from version 2]
//
// where flags bit 0 is fill_holes.
func (c *config) wrapAD() []byte {
	k := &c.KDF
	ad := append([]byte("shale-crypt v"+strconv.Itoa(c.Version)+" scrypt"), 0, byte(k.LogN))
	ad = binary.BigEndian.AppendUint32(ad, uint32(k.R))
	ad = binary.BigEndian.AppendUint32(ad, uint32(k.P))
	ad = append(ad, k.Salt...)
	if c.Version >= 2 {
		var flags byte
		if c.FillHoles {
			flags |= 1
		}
		ad = append(ad, flags)
	}
	return ad
}

func (c *config) checksum() string {
	h := sha256.New()
	h.Write(c.wrapAD())
	h.Write(c.Nonce)
	h.Write(c.WrappedKey)
	return hex.EncodeToString(h.Sum(nil))
}

// validate checks everything that can be checked without the passphrase.
func (c *config) validate() error {
	switch {
	case c.Format != configFormat:
		return fmt.Errorf("format is %q, want %q", c.Format, configFormat)
	case c.Version != 1 && c.Version != configVersion:
		return fmt.Errorf("format version %d, this shale reads versions 1 and %d", c.Version, configVersion)
	case c.Version == 1 && c.FillHoles:
		return errors.New("fill_holes needs format version 2")
	case c.KDF.Name != kdfScrypt:
		return fmt.Errorf("key derivation %q, this shale knows %q", c.KDF.Name, kdfScrypt)
	case c.KDF.LogN < 1 || c.KDF.LogN > 30 || c.KDF.R < 1 || c.KDF.P < 1 || c.KDF.P > 16 ||
		c.KDF.R > maxScryptMem/128>>c.KDF.LogN:
		return fmt.Errorf("scrypt parameters log N=%d r=%d p=%d are out of range (memory at most 1 GiB, p at most 16)", c.KDF.LogN, c.KDF.R, c.KDF.P)
	case len(c.KDF.Salt) != saltSize:
		return fmt.Errorf("salt is %d bytes, want %d", len(c.KDF.Salt), saltSize)
	case len(c.Nonce) != wrapNonceSize:
		return fmt.Errorf("nonce is %d bytes, want %d", len(c.Nonce), wrapNonceSize)
	case len(c.WrappedKey) != masterKeySize+tagSize:
		return fmt.Errorf("wrapped key is %d bytes, want %d", len(c.WrappedKey), masterKeySize+tagSize)
	case c.Checksum != c.checksum():
		return errors.New("checksum does not match its contents")
	}
	return nil
}

// readConfig reads and vets lower/shale.conf and returns it with its path.
func readConfig(ctx context.Context, lower layer.Node, name string) (*config, string, error) {
	path := lowerPath(name, ConfigName)
	data, err := layer.ReadFile(ctx, lower, ConfigName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, path, fmt.Errorf("%s is %w: %s is missing; make one with: shale init --layer crypt %s", name, ErrNoConfig, path, shellWord(name))
	}
	if err != nil {
		return nil, path, fmt.Errorf("read config: %w", inLower(name, err))
	}
	var c config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err = dec.Decode(&c); err == nil {
		err = c.validate()
	}
	if err != nil {
		return nil, path, fmt.Errorf("%s is %w (%v): restore it from a backup; without it the files in %s cannot be read", path, ErrDamaged, err, name)
	}
	return &c, path, nil
}

// writeConfig writes c to lower/shale.conf atomically (layer.WriteFileAtomic):
// linked into place for a new config, which fails if one appeared
// meanwhile, or renamed over the old one for a replacement.
func writeConfig(ctx context.Context, lower layer.Node, name string, c *config, replace bool) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	err = layer.WriteFileAtomic(ctx, lower, ConfigName, data, 0o600, replace)
	if !replace && errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s appeared while writing it: %s is %w", lowerPath(name, ConfigName), name, ErrInitialised)
	}
	if err != nil {
		return fmt.Errorf("write config: %w", inLower(name, err))
	}
	return nil
}

// lowerPath names file in LOWER, called name, for messages: a host path,
// or "file in URL" for a remote LOWER, whose URL may end in a query.
func lowerPath(name, file string) string {
	switch {
	case !strings.Contains(name, "://"):
		return filepath.Join(name, file)
	case file == ".":
		return name
	}
	return file + " in " + name
}

// inLower makes err, from a layer file helper, name its file by lowerPath,
// as os's errors named host paths.
func inLower(name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		pe.Path = lowerPath(name, pe.Path)
	}
	return err
}

// shellWord is s as a shell reads it back: in single quotes where it has
// characters a shell would take (a 9p:// URL's ?, &).
func shellWord(s string) string {
	const plain = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-:+,@%="
	for _, r := range s {
		if !strings.ContainsRune(plain, r) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}
