package volume

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
)

// Format is what a volume records about itself when it is made (key
// "format"): how its data is laid out and where it lives.
type Format struct {
	Version     int    `json:"version"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	BlockSize   int    `json:"block_size"`
	Compression string `json:"compression"` // none or zstd
	Data        string `json:"data"`        // the DataURL
	Created     string `json:"created"`
}

// formatVersion is the layout docs/volume.md describes.
const formatVersion = 1

// DefaultBlockSize is the size of a block unless format says otherwise.
const DefaultBlockSize = 4 << 20

// URL is a volume's address: etcd://HOST:PORT[,HOST:PORT...]/NAME, with
// ?cacert=F&cert=F&key=F for a cluster that speaks TLS (etcdctl's flags),
// and the client's cache: cachedir=DIR, cachesize=BYTES (Options).
type URL struct {
	Etcd      EtcdConfig
	Name      string
	CacheDir  string
	CacheSize int64
}

// IsURL tells whether s names a volume rather than another lower.
func IsURL(s string) bool { return strings.HasPrefix(s, "etcd://") }

// ParseURL reads a volume's address.
func ParseURL(s string) (URL, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		return URL{}, fmt.Errorf("%s: not a volume: want etcd://HOST:2379[,HOST...]/NAME", s)
	}
	rest, query, _ := strings.Cut(rest, "?")
	hosts, name, _ := strings.Cut(rest, "/")
	var u URL
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if !strings.Contains(h, ":") {
			h += ":2379"
		}
		u.Etcd.Endpoints = append(u.Etcd.Endpoints, h)
	}
	if len(u.Etcd.Endpoints) == 0 {
		return URL{}, fmt.Errorf("%s: no etcd member: want etcd://HOST:2379[,HOST...]/NAME", s)
	}
	if name == "" || strings.ContainsAny(name, "/ ") {
		return URL{}, fmt.Errorf("%s: want one volume name after the members: etcd://HOST:2379/NAME", s)
	}
	u.Name = name
	q, err := url.ParseQuery(query)
	if err != nil {
		return URL{}, fmt.Errorf("%s: %v", s, err)
	}
	for k, v := range q {
		switch k {
		case "cacert":
			u.Etcd.CACert = v[0]
		case "cert":
			u.Etcd.Cert = v[0]
		case "key":
			u.Etcd.Key = v[0]
		case "user":
			u.Etcd.Username, u.Etcd.Password, _ = strings.Cut(v[0], ":")
		case "cachedir":
			if !filepath.IsAbs(v[0]) {
				return URL{}, fmt.Errorf("%s: cachedir=%s: want an absolute directory", s, v[0])
			}
			u.CacheDir = v[0]
		case "cachesize":
			if v[0] == "off" || v[0] == "0" {
				u.CacheSize = -1 // nothing cached
				continue
			}
			n, err := humanize.ParseBytes(v[0])
			if err != nil || n < 128<<10 || n > 1<<50 {
				return URL{}, fmt.Errorf("%s: cachesize=%s: want a size such as 4GiB (at least 128KiB), or off", s, v[0])
			}
			u.CacheSize = int64(n)
		default:
			return URL{}, fmt.Errorf("%s: unknown option %s: a volume takes cacert, cert, key, user, cachedir and cachesize", s, k)
		}
	}
	if u.CacheDir != "" && u.CacheSize < 0 {
		return URL{}, fmt.Errorf("%s: cachedir with cachesize=off: give the disk cache a size", s)
	}
	return u, nil
}

// FormatOptions are the choices made when a volume is made.
type FormatOptions struct {
	Data        DataURL
	BlockSize   int    // 0: DefaultBlockSize
	Compression string // "" or none, zstd
	Uid, Gid    uint32 // the root directory's owner
}

// Create makes the volume u with its data at o.Data: its format record
// and an empty root directory, in one transaction, if no volume of that
// name is there yet.
func Create(ctx context.Context, u URL, o FormatOptions) (Format, error) {
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.BlockSize < 4096 || o.BlockSize > 64<<20 || o.BlockSize&(o.BlockSize-1) != 0 {
		return Format{}, fmt.Errorf("block size %d: want a power of two from 4KiB to 64MiB", o.BlockSize)
	}
	if o.Compression == "" {
		o.Compression = "none"
	}
	bs, err := newBlockStore(ctx, o.Data, o.Compression, 0)
	if err != nil {
		return Format{}, err
	}
	if err := bs.check(ctx); err != nil {
		return Format{}, err
	}
	eng, err := DialEtcd(ctx, u.Etcd)
	if err != nil {
		return Format{}, err
	}
	defer eng.Close()
	f := Format{Version: formatVersion, Name: u.Name, UUID: newID(), BlockSize: o.BlockSize,
		Compression: o.Compression, Data: o.Data.String(), Created: time.Now().UTC().Format(time.RFC3339)}
	k := newKeys(u.Name)
	now := nowNs()
	root := Inode{Mode: syscall.S_IFDIR | 0o755, Uid: o.Uid, Gid: o.Gid, Nlink: 2, Atime: now, Mtime: now, Ctime: now, Parent: rootIno}
	exists := false
	_, err = eng.Txn(ctx, func(tx Tx) error {
		v, err := tx.Get(k.format())
		if err != nil {
			return err
		}
		if exists = v[0] != nil; exists {
			return nil
		}
		tx.Put(k.format(), mustJSON(f))
		tx.Put(k.next(), []byte(fmt.Sprint(rootIno+1)))
		tx.Put(k.inode(rootIno), mustJSON(root))
		return nil
	})
	if err != nil {
		return Format{}, fmt.Errorf("etcd %v: %v", u.Etcd.Endpoints, err)
	}
	if exists {
		return Format{}, fmt.Errorf("volume %s already exists on etcd %v: choose another name", u.Name, u.Etcd.Endpoints)
	}
	return f, nil
}
