package volume

import (
	"context"
	"encoding/json"
	"fmt"
)

// Report is what shale volume status tells about a volume.
type Report struct {
	Format   Format
	Members  []string
	Inodes   int    // inode records
	Files    int    // regular files among them
	Bytes    uint64 // their sizes, added up
	Blocks   int    // objects the files refer to
	Garbage  int    // objects no longer referenced, waiting for gc
	Revision int64  // etcd's revision the report was read at
}

// Status reads the volume u whole: one range read of its inodes, one of
// its garbage records.
func Status(ctx context.Context, u URL) (*Report, error) {
	eng, err := DialEtcd(ctx, u.Etcd)
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	k := newKeys(u.Name)
	b, err := eng.Get(ctx, k.format())
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("no volume %s on etcd %v: make it with shale format", u.Name, u.Etcd.Endpoints)
	}
	r := &Report{Members: u.Etcd.Endpoints}
	if err := json.Unmarshal(b, &r.Format); err != nil {
		return nil, fmt.Errorf("volume %s: bad format record: %v", u.Name, err)
	}
	kvs, rev, err := eng.List(ctx, k.p+"i/", 0)
	if err != nil {
		return nil, err
	}
	r.Revision = rev
	for _, kv := range kvs {
		in, err := decodeInode(kv.Val)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", kv.Key, err)
		}
		r.Inodes++
		if len(in.Blocks) > 0 || in.Mode&0o170000 == 0o100000 {
			r.Files++
			r.Bytes += in.Size
			for _, bl := range in.Blocks {
				if bl.ID != "" {
					r.Blocks++
				}
			}
		}
	}
	gs, _, err := eng.List(ctx, k.garbage(), 0)
	if err != nil {
		return nil, err
	}
	for _, kv := range gs {
		var g Garbage
		if json.Unmarshal(kv.Val, &g) == nil {
			r.Garbage += len(g.IDs)
		}
	}
	return r, nil
}
