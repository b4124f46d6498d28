package volume

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// etcdEngine is the Engine on an etcd cluster (v3 API, 3.4 and later).
type etcdEngine struct {
	c *clientv3.Client
	// marker is this client's key that every transaction also writes
	// with its sequence number: a commit whose reply is lost (the member
	// died) is found out by reading it, rather than done twice.
	marker string
	seq    atomic.Uint64

	leaseMu sync.Mutex
	lease   clientv3.LeaseID
}

// leaseTTL is how long a dead client's leased keys outlive it.
const leaseTTL = 60

func (e *etcdEngine) Lease(ctx context.Context) (int64, error) {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if e.lease != 0 {
		return int64(e.lease), nil
	}
	g, err := e.c.Grant(ctx, leaseTTL)
	if err != nil {
		return 0, err
	}
	ch, err := e.c.KeepAlive(context.Background(), g.ID)
	if err != nil {
		return 0, err
	}
	e.lease = g.ID
	go func() {
		for range ch {
		}
		// Renewal ended (Close, or the lease expired while the cluster
		// was out of reach): the next call takes a new one.
		e.leaseMu.Lock()
		if e.lease == g.ID {
			e.lease = 0
		}
		e.leaseMu.Unlock()
	}()
	return int64(g.ID), nil
}

// EtcdConfig is how to reach a cluster: its members and, for TLS, the
// files etcdctl's --cacert, --cert and --key name.
type EtcdConfig struct {
	Endpoints          []string
	CACert, Cert, Key  string
	Username, Password string
	DialTimeout        time.Duration // 0: 10 s
}

// DialEtcd connects to the cluster of c.
func DialEtcd(ctx context.Context, c EtcdConfig) (Engine, error) {
	cfg := clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: c.DialTimeout,
		Username:    c.Username,
		Password:    c.Password,
		Context:     context.Background(),
		// A member that stops answering is left for another.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 10 * time.Second,
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if c.CACert != "" || c.Cert != "" {
		info := transport.TLSInfo{TrustedCAFile: c.CACert, CertFile: c.Cert, KeyFile: c.Key}
		var tc *tls.Config
		var err error
		if tc, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("etcd TLS: %v", err)
		}
		cfg.TLS = tc
	}
	cl, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	// clientv3.New does not wait for a member: ask one, so that a wrong
	// address is told now, not at the first file operation.
	sctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cl.Get(sctx, "\x00"); err != nil {
		cl.Close()
		return nil, fmt.Errorf("no etcd member of %v answers: %v", c.Endpoints, err)
	}
	return &etcdEngine{c: cl, marker: "shale/.txn/" + newID()}, nil
}

func (e *etcdEngine) Close() error { return e.c.Close() }

func (e *etcdEngine) Get(ctx context.Context, key string) ([]byte, error) {
	r, err := e.c.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return present(r.Kvs[0].Value), nil
}

func (e *etcdEngine) List(ctx context.Context, prefix string, limit int) ([]KV, int64, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	r, err := e.c.Get(ctx, prefix, opts...)
	if err != nil {
		return nil, 0, err
	}
	kvs := make([]KV, len(r.Kvs))
	for i, kv := range r.Kvs {
		kvs[i] = KV{Key: string(kv.Key), Val: present(kv.Value), Mod: kv.ModRevision}
	}
	return kvs, r.Header.Revision, nil
}

// present keeps an empty value apart from an absent one (nil).
func present(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

func (e *etcdEngine) Txn(ctx context.Context, fn func(tx Tx) error) (int64, error) {
	for attempt := 0; ; attempt++ {
		tx := &etcdTx{ctx: ctx, c: e.c, reads: map[string]int64{}, writes: map[string][]byte{}}
		if err := fn(tx); err != nil {
			return 0, err
		}
		if len(tx.ops) == 0 {
			return 0, nil
		}
		cmps := make([]clientv3.Cmp, 0, len(tx.reads))
		for k, rev := range tx.reads {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
		}
		seq := strconv.FormatUint(e.seq.Add(1), 10)
		ops := append(tx.ops, e.markerOp(ctx, seq))
		r, err := e.c.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			rev, done, ferr := e.findCommit(ctx, seq)
			if ferr != nil {
				return 0, fmt.Errorf("%v (and then: %v)", err, ferr)
			}
			if done {
				return rev, nil
			}
			continue // not applied: again, from the reads
		}
		if r.Succeeded {
			return r.Header.Revision, nil
		}
		// Another client changed what we read: again, after a pause that
		// grows and is random, so that contenders part.
		d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 8)))
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(d):
		}
	}
}

// markerOp writes this client's marker, bound to its lease if it has
// one, so that a dead client's marker goes with it.
func (e *etcdEngine) markerOp(ctx context.Context, seq string) clientv3.Op {
	if lease, err := e.Lease(ctx); err == nil {
		return clientv3.OpPut(e.marker, seq, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	return clientv3.OpPut(e.marker, seq)
}

// findCommit tells whether the transaction that wrote seq to the marker
// was applied, and at which revision, asking until the cluster answers
// or ctx ends. A linearizable read after a lost reply sees every entry
// of the old leader's that will ever be committed.
func (e *etcdEngine) findCommit(ctx context.Context, seq string) (int64, bool, error) {
	for {
		r, err := e.c.Get(ctx, e.marker)
		if err == nil {
			if len(r.Kvs) > 0 && string(r.Kvs[0].Value) == seq {
				return r.Kvs[0].ModRevision, true, nil
			}
			return 0, false, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// etcdTx records the mod revision of every key it read, to compare at
// commit; its writes become the transaction's operations.
type etcdTx struct {
	ctx    context.Context
	c      *clientv3.Client
	reads  map[string]int64
	writes map[string][]byte // key -> value; nil for a delete
	ops    []clientv3.Op
}

func (t *etcdTx) Get(keys ...string) ([][]byte, error) { return valuesOnly(t.Read(keys...)) }

func (t *etcdTx) Read(keys ...string) ([]Value, error) {
	known := func(k string) (Value, bool) {
		v, ok := t.writes[k]
		return Value{Val: v}, ok // our own write
	}
	return readSome(keys, known, func(ask []string) ([]Value, error) {
		// Reads only: safe to send again when the member that had them
		// died (etcd's client retries single reads itself).
		for {
			vs, _, err := readKeys(t.ctx, t.c, ask)
			if err == nil {
				for j, v := range vs {
					t.Assume(ask[j], v)
				}
				return vs, nil
			}
			select {
			case <-t.ctx.Done():
				return nil, err
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// Assume records v as read: the commit compares key's mod revision.
func (t *etcdTx) Assume(key string, v Value) {
	if old, ok := t.reads[key]; !ok || old == v.Mod {
		t.reads[key] = v.Mod
	} else {
		t.reads[key] = -1 // read twice, differently: must retry
	}
}

// readKeys reads keys in one request (a transaction of reads).
func readKeys(ctx context.Context, c *clientv3.Client, keys []string) ([]Value, int64, error) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	r, err := c.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, err
	}
	out := make([]Value, len(keys))
	for j, rr := range r.Responses {
		if kvs := rr.GetResponseRange().Kvs; len(kvs) > 0 {
			out[j] = Value{Val: present(kvs[0].Value), Mod: kvs[0].ModRevision}
		}
	}
	return out, r.Header.Revision, nil
}

func (e *etcdEngine) Read(ctx context.Context, keys ...string) ([]Value, int64, error) {
	return readKeys(ctx, e.c, keys)
}

func (t *etcdTx) Put(key string, val []byte) {
	if val == nil {
		val = []byte{}
	}
	t.writes[key] = val
	t.ops = append(t.ops, clientv3.OpPut(key, string(val)))
}

func (t *etcdTx) PutLeased(key string, val []byte, lease int64) {
	t.writes[key] = val
	t.ops = append(t.ops, clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease))))
}

func (t *etcdTx) Delete(key string) {
	t.writes[key] = nil
	t.ops = append(t.ops, clientv3.OpDelete(key))
}

func (t *etcdTx) DeletePrefix(prefix string) {
	t.ops = append(t.ops, clientv3.OpDelete(prefix, clientv3.WithPrefix()))
}

func (e *etcdEngine) Watch(ctx context.Context, prefix string, rev int64) <-chan Change {
	out := make(chan Change, 256)
	go func() {
		defer close(out)
		next := rev + 1
		for ctx.Err() == nil {
			wctx := clientv3.WithRequireLeader(ctx)
			for r := range e.c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(next), clientv3.WithCreatedNotify()) {
				if r.Created {
					if !send(ctx, out, Change{Up: true, Rev: next - 1}) {
						return
					}
					continue
				}
				if r.CompactRevision != 0 {
					// What lay between is gone: say so, go on from there.
					next = r.CompactRevision
					if !send(ctx, out, Change{Lost: true, Rev: next}) {
						return
					}
					break
				}
				for _, ev := range r.Events {
					c := Change{Key: string(ev.Kv.Key), Rev: ev.Kv.ModRevision}
					if ev.Type == clientv3.EventTypePut {
						c.Val = ev.Kv.Value
						if c.Val == nil {
							c.Val = []byte{}
						}
					}
					if !send(ctx, out, c) {
						return
					}
					next = ev.Kv.ModRevision + 1
				}
			}
			// The watch ended (no leader, member gone): resume after a
			// pause, from the next revision: nothing is missed.
			if !send(ctx, out, Change{Down: true, Rev: next - 1}) {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return out
}

func send(ctx context.Context, out chan<- Change, c Change) bool {
	select {
	case out <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

func (e *etcdEngine) Lock(ctx context.Context, key string) (func(), error) {
	s, err := concurrency.NewSession(e.c, concurrency.WithTTL(30))
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, key)
	if err := m.TryLock(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return func() {
		m.Unlock(context.Background())
		s.Close()
	}, nil
}
