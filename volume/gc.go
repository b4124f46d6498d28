package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// GCReport is what a collection freed.
type GCReport struct {
	Records int   // garbage records done with
	Objects int   // objects deleted
	Bytes   int64 // their size in the bucket
	Orphans int   // of them, objects no record or inode named (a write-back cut short)
	Waiting int   // objects not yet old enough
	Inodes  int   // orphan inodes removed: no links, and the client that had them open is gone
}

// reapOrphans removes the inodes without links whose o/ key went with
// the lease of the client that had them open: it died, or lost the
// cluster for longer than the lease. Their blocks go to a garbage record.
func reapOrphans(ctx context.Context, eng Engine, k keys) (int, error) {
	kvs, _, err := eng.List(ctx, k.p+"i/", 0)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kv := range kvs {
		in, err := decodeInode(kv.Val)
		if err != nil || in.Nlink > 0 || in.isDir() {
			continue
		}
		_, ino, _ := k.parse(kv.Key)
		reaped := false
		fs := &FS{eng: eng, k: k}
		_, err = eng.Txn(ctx, func(tx Tx) error {
			reaped = false
			v, err := tx.Get(k.inode(ino), k.orphan(ino))
			if err != nil || v[0] == nil || v[1] != nil {
				return err // gone, or still open somewhere
			}
			in, err := decodeInode(v[0])
			if err != nil || in.Nlink > 0 {
				return err
			}
			t := &ntx{fs: fs, tx: tx, inodes: map[uint64]*Inode{ino: in}, dirty: map[uint64]bool{}, now: nowNs()}
			t.drop(ino)
			t.commit()
			reaped = true
			return nil
		})
		if err != nil {
			return n, err
		}
		if reaped {
			n++
		}
	}
	return n, nil
}

// ErrCollecting says another collector is at work on the volume.
var ErrCollecting = errors.New("another gc is collecting this volume")

// GC deletes the objects no inode refers to any more, once they are older
// than delay, so that a reader that read a block list before the change
// still finds its blocks. One collector at a time: it holds a lock bound
// to its etcd lease. Objects are found two ways: the garbage records the
// transactions that dropped them left, and a listing of the bucket for
// objects no inode names (blocks written by a client that died before it
// swapped them in).
func GC(ctx context.Context, u URL, delay time.Duration) (*GCReport, error) {
	eng, err := DialEtcd(ctx, u.Etcd)
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	k := newKeys(u.Name)
	unlock, err := eng.Lock(ctx, k.p+"gc")
	if errors.Is(err, concurrency.ErrLocked) {
		return nil, ErrCollecting
	}
	if err != nil {
		return nil, err
	}
	defer unlock()
	b, err := eng.Get(ctx, k.format())
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("no volume %s there", u.Name)
	}
	var f Format
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	d, err := ParseDataURL(f.Data)
	if err != nil {
		return nil, err
	}
	bs, err := newBlockStore(ctx, d, f.Compression, 1)
	if err != nil {
		return nil, err
	}
	r := &GCReport{}
	if r.Inodes, err = reapOrphans(ctx, eng, k); err != nil {
		return nil, err
	}
	// Inodes first, then records: an object dropped in between is in a
	// record, and waits its delay there.
	used := map[string]bool{}
	inodes, _, err := eng.List(ctx, k.p+"i/", 0)
	if err != nil {
		return nil, err
	}
	for _, kv := range inodes {
		in, err := decodeInode(kv.Val)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", kv.Key, err)
		}
		for _, bl := range in.Blocks {
			used[bl.ID] = true
		}
	}
	recs, _, err := eng.List(ctx, k.garbage(), 0)
	if err != nil {
		return nil, err
	}
	cutoff := time.Now().Add(-delay)
	listed := map[string]bool{}
	for _, kv := range recs {
		var g Garbage
		if err := json.Unmarshal(kv.Val, &g); err != nil {
			return nil, fmt.Errorf("%s: %v", kv.Key, err)
		}
		for _, id := range g.IDs {
			listed[id] = true
		}
		if time.Unix(0, g.Time).After(cutoff) {
			r.Waiting += len(g.IDs)
			continue
		}
		for _, id := range g.IDs {
			if used[id] {
				continue // never: an object is written once, dropped once
			}
			n, err := bs.removeCounted(ctx, id)
			if err != nil {
				return r, err
			}
			r.Objects++
			r.Bytes += n
		}
		key := kv.Key
		if _, err := eng.Txn(ctx, func(tx Tx) error { tx.Delete(key); return nil }); err != nil {
			return r, err
		}
		r.Records++
	}
	// Objects nobody names: written, never swapped in.
	for o := range bs.c.ListObjects(ctx, d.Bucket, minio.ListObjectsOptions{Prefix: bs.blocksPrefix(), Recursive: true}) {
		if o.Err != nil {
			return r, o.Err
		}
		id := o.Key[strings.LastIndex(o.Key, "/")+1:]
		if used[id] || listed[id] {
			continue
		}
		if o.LastModified.After(cutoff) {
			r.Waiting++
			continue
		}
		if err := bs.remove(ctx, id); err != nil {
			return r, err
		}
		r.Objects++
		r.Orphans++
		r.Bytes += o.Size
	}
	return r, nil
}

// removeCounted deletes object id and returns its size (0 if it was gone
// already: a collection cut short deletes again).
func (s *blockStore) removeCounted(ctx context.Context, id string) (int64, error) {
	st, err := s.c.StatObject(ctx, s.d.Bucket, s.key(id), minio.StatObjectOptions{})
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return 0, nil
		}
		return 0, err
	}
	return st.Size, s.remove(ctx, id)
}
