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
	Put(key string, val []byte)
	// PutLeased puts key bound to lease (Engine.Lease).
	PutLeased(key string, val []byte, lease int64)
	Delete(key string)
	// DeletePrefix deletes every key under prefix (xattrs of a removed
	// inode: they need not be read first).
	DeletePrefix(prefix string)
}

// KV is one key and its value.
type KV struct {
	Key string
	Val []byte
}

// Change is one key's change in a watch: Val nil for a delete. Rev is the
// revision of the transaction that made it.
type Change struct {
	Key  string
	Val  []byte
	Rev  int64
	Lost bool // changes were lost: everything may have changed
}
