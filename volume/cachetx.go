package volume

import "bytes"

// cacheTx is the transaction of one FS.update: it answers reads from the
// metadata cache when allowed (Tx.Assume: the commit still compares
// their revisions), and records what it read and wrote, for the cache
// once committed (mcache.committed).
type cacheTx struct {
	Tx
	fs       *FS
	use      bool // answer reads from the cache
	assumed  bool // some read was answered from it
	reads    map[string]Value
	writes   map[string][]byte // nil: deleted
	prefixes []string
}

func newCacheTx(fs *FS, tx Tx, use bool) *cacheTx {
	return &cacheTx{Tx: tx, fs: fs, use: use, reads: map[string]Value{}, writes: map[string][]byte{}}
}

func (t *cacheTx) Get(keys ...string) ([][]byte, error) { return valuesOnly(t.Read(keys...)) }

func (t *cacheTx) Read(keys ...string) ([]Value, error) {
	known := func(k string) (Value, bool) {
		if v, ok := t.writes[k]; ok {
			return Value{Val: v}, true // our own write
		}
		if !t.use {
			return Value{}, false
		}
		v, ok := t.fs.meta.get(t.fs.k, k)
		if ok {
			t.Tx.Assume(k, v)
			t.reads[k], t.assumed = v, true
		}
		return v, ok
	}
	return readSome(keys, known, func(ask []string) ([]Value, error) {
		vs, err := t.Tx.Read(ask...)
		for j, v := range vs {
			t.reads[ask[j]] = v
		}
		return vs, err
	})
}

func (t *cacheTx) Put(key string, val []byte) {
	val = kept(val)
	t.writes[key] = val
	t.Tx.Put(key, val)
}

func (t *cacheTx) PutLeased(key string, val []byte, lease int64) {
	val = kept(val)
	t.writes[key] = val
	t.Tx.PutLeased(key, val, lease)
}

// kept is a copy of val for the cache, which outlives the request:
// the caller's buffer may be reused (go-fuse's for a setxattr's value).
// Never nil: nil is a delete.
func kept(val []byte) []byte {
	if val == nil {
		return []byte{}
	}
	return bytes.Clone(val)
}

func (t *cacheTx) Delete(key string) {
	t.writes[key] = nil
	t.Tx.Delete(key)
}

func (t *cacheTx) DeletePrefix(prefix string) {
	t.prefixes = append(t.prefixes, prefix)
	t.Tx.DeletePrefix(prefix)
}
