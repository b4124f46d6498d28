package volume

import "context"

// Engine is a volume's metadata engine: an ordered key-value store with
// serializable multi-key transactions and a change stream. etcd is the
// first (etcd.go); TiKV or FoundationDB fit the same shape.
type Engine interface {
	// Txn runs fn in a transaction and commits what it wrote if nothing
	// it read has changed since; otherwise it runs fn again, so fn must
	// have no effect but through tx. It returns the revision of the
	// commit (0 if fn wrote nothing) or fn's error.
	Txn(ctx context.Context, fn func(tx Tx) error) (rev int64, err error)
	// Get reads key outside a transaction (nil: absent).
	Get(ctx context.Context, key string) ([]byte, error)
	// Read reads keys outside a transaction, in one round trip, and
	// returns the revision they were read at.
	Read(ctx context.Context, keys ...string) ([]Value, int64, error)
	// List returns the keys under prefix in order, at most limit (0: all),
	// and the revision they were read at.
	List(ctx context.Context, prefix string, limit int) ([]KV, int64, error)
	// Watch sends the changes under prefix made after revision rev, in
	// order, until ctx ends. A gap it cannot fill (the engine compacted
	// the revisions away) is one Change with Lost set.
	Watch(ctx context.Context, prefix string, rev int64) <-chan Change
	// Lease is this client's lease: keys put with it vanish when the
	// client stops renewing it (it died, or lost the cluster for ttl).
	// Made on the first call, renewed until Close.
	Lease(ctx context.Context) (int64, error)
	// Lock takes the lock named key, held for this client while it lives
	// (a lease: a client that dies loses it); unlock gives it back.
	Lock(ctx context.Context, key string) (unlock func(), err error)
	Close() error
}

// Tx is one transaction's view: reads are recorded and checked at commit,
// writes are buffered and applied at once.
type Tx interface {
	// Get reads keys in one round trip; an absent key reads nil.
	Get(keys ...string) ([][]byte, error)
	// Read is Get with each key's mod revision.
	Read(keys ...string) ([]Value, error)
	// Assume takes v as key's value without reading it: the commit
	// compares its mod revision as if it had been read (the client's
	// metadata cache, mcache.go, knows it).
	Assume(key string, v Value)
	Put(key string, val []byte)
	// PutLeased puts key bound to lease (Engine.Lease).
	PutLeased(key string, val []byte, lease int64)
	Delete(key string)
	// DeletePrefix deletes every key under prefix (xattrs of a removed
	// inode: they need not be read first).
	DeletePrefix(prefix string)
}

// Value is a key's value (nil: absent) and the revision of its last
// change (0: absent).
type Value struct {
	Val []byte
	Mod int64
}

// valuesOnly is what Read returned, without the revisions (Tx.Get).
func valuesOnly(vs []Value, err error) ([][]byte, error) {
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = v.Val
	}
	return out, nil
}

// readSome answers keys from known where it can and the rest by one call
// of fetch, in order.
func readSome(keys []string, known func(string) (Value, bool), fetch func([]string) ([]Value, error)) ([]Value, error) {
	out := make([]Value, len(keys))
	var ask []string
	var idx []int
	for i, k := range keys {
		if v, ok := known(k); ok {
			out[i] = v
			continue
		}
		ask = append(ask, k)
		idx = append(idx, i)
	}
	if len(ask) == 0 {
		return out, nil
	}
	vs, err := fetch(ask)
	if err != nil {
		return nil, err
	}
	for j, v := range vs {
		out[idx[j]] = v
	}
	return out, nil
}

// KV is one key and its value.
type KV struct {
	Key string
	Val []byte
	Mod int64 // the revision of its last change
}

// Change is one key's change in a watch: Val nil for a delete. Rev is the
// revision of the transaction that made it. Up and Down tell the watch's
// own state: it (re)started, after which changes made meanwhile come
// (Up), or it broke and changes are held back until it resumes (Down).
type Change struct {
	Key      string
	Val      []byte
	Rev      int64
	Lost     bool // changes were lost: everything may have changed
	Up, Down bool
}
