package main

import (
	"crypto/md5"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/shalefs/shale/objstore"
)

// fileStore is the peer: one file per object on the host file system, laid
// out like nginx's proxy_cache with levels=1:2. The name is the MD5 of the
// key in hex; the first level is its last character, the second the two
// before, and a create writes a temporary file and renames it into place.
type fileStore struct {
	dir string
	tmp atomic.Uint64
}

func newFileStore(dir string) (*fileStore, error) {
	const hexdigits = "0123456789abcdef"
	if err := os.MkdirAll(filepath.Join(dir, "temp"), 0o755); err != nil {
		return nil, err
	}
	// nginx's cache loader makes the levels as needed; making them up front
	// keeps that cost out of the peer's timings.
	for _, a := range hexdigits {
		for _, b := range hexdigits {
			for _, c := range hexdigits {
				if err := os.MkdirAll(filepath.Join(dir, string(a), string(b)+string(c)), 0o755); err != nil {
					return nil, err
				}
			}
		}
	}
	return &fileStore{dir: dir}, nil
}

func (f *fileStore) path(key string) string {
	sum := md5.Sum([]byte(key))
	h := hex.EncodeToString(sum[:])
	return filepath.Join(f.dir, h[31:], h[29:31], h)
}

func (f *fileStore) Create(key string, data []byte) error {
	tmp := filepath.Join(f.dir, "temp", strconv.FormatUint(f.tmp.Add(1), 10))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.path(key))
}

func (f *fileStore) Read(key string) ([]byte, error) {
	b, err := os.ReadFile(f.path(key))
	if os.IsNotExist(err) {
		return nil, objstore.ErrNotFound
	}
	return b, err
}

func (f *fileStore) Remove(key string) error { return os.Remove(f.path(key)) }

func (f *fileStore) Sync() error { return nil }
