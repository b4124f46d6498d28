package volume

import (
	"context"
	"encoding/json"
)

// A listing reads a directory's entries and the inodes they lead to into
// the metadata cache (mcache.go), for the lookups the kernel makes right
// after it (READDIRPLUS looks up every entry): one request per hundred
// entries instead of two per entry.

// prefetchBatch is the inodes read per request (etcd allows 128
// operations in one).
const prefetchBatch = 100

// entries is directory dir's entries, by name (KV.Key is the name), from
// the cache if it knows them all, else listed and the inodes they lead
// to read into it.
func (fs *FS) entries(ctx context.Context, dir uint64) ([]KV, error) {
	if kvs, ok := fs.meta.names(dir); ok {
		return kvs, nil
	}
	cctx, cancel := fs.ctx(ctx)
	defer cancel()
	prefix := fs.k.dir(dir)
	kvs, rev, err := fs.eng.List(cctx, prefix, 0)
	if err != nil {
		return nil, err
	}
	fs.meta.listed(fs.k, dir, rev, kvs)
	for i := range kvs {
		kvs[i].Key = kvs[i].Key[len(prefix):]
	}
	fs.prefill(ctx, kvs)
	return kvs, nil
}

// prefill reads into the cache the inodes of entries it does not know.
func (fs *FS) prefill(ctx context.Context, ents []KV) {
	if !fs.meta.answers() {
		return // the lookups would not take them from it
	}
	var keys []string
	for _, kv := range ents {
		var d Dirent
		if json.Unmarshal(kv.Val, &d) != nil {
			continue
		}
		k := fs.k.inode(d.Ino)
		if _, ok := fs.meta.get(fs.k, k); !ok {
			keys = append(keys, k)
		}
	}
	for lo := 0; lo < len(keys); lo += prefetchBatch {
		if _, err := fs.read(ctx, keys[lo:min(lo+prefetchBatch, len(keys))]...); err != nil {
			return // the lookups will read what they need
		}
	}
}
