package volume

import (
	"bytes"
	"container/list"
	"context"
	"crypto/rand"
	hexenc "encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// DataURL is where a volume's blocks live: s3://ENDPOINT/BUCKET/PREFIX
// (HTTPS), or http://ENDPOINT/BUCKET/PREFIX for a server without TLS.
type DataURL struct {
	Endpoint, Bucket, Prefix string
	Secure                   bool
}

// ParseDataURL reads a --data location.
func ParseDataURL(s string) (DataURL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return DataURL{}, fmt.Errorf("--data %s: %v", s, err)
	}
	d := DataURL{Endpoint: u.Host}
	switch u.Scheme {
	case "s3", "https":
		d.Secure = true
	case "http":
	default:
		return DataURL{}, fmt.Errorf("--data %s: want s3://ENDPOINT/BUCKET/PREFIX (or http:// for a server without TLS)", s)
	}
	d.Bucket, d.Prefix, _ = strings.Cut(strings.Trim(u.Path, "/"), "/")
	if d.Endpoint == "" || d.Bucket == "" {
		return DataURL{}, fmt.Errorf("--data %s: want s3://ENDPOINT/BUCKET/PREFIX: an endpoint and a bucket at least", s)
	}
	return d, nil
}

func (d DataURL) String() string {
	scheme := "s3"
	if !d.Secure {
		scheme = "http"
	}
	s := scheme + "://" + d.Endpoint + "/" + d.Bucket
	if d.Prefix != "" {
		s += "/" + d.Prefix
	}
	return s
}

// blockStore keeps blocks as objects of a bucket, each written once and
// never changed, so a cached copy is always good.
type blockStore struct {
	c     *minio.Client
	d     DataURL
	zstd  bool // blocks are compressed
	enc   *zstd.Encoder
	dec   *zstd.Decoder
	cache *blockCache
	disk  *diskCache // nil: none

	fetches fetches // in flight, and read-ahead (readahead.go)
}

// newBlockStore reaches the bucket with the credentials users expect: the
// AWS variables, then ~/.aws/credentials (AWS_PROFILE), then an instance
// role.
func newBlockStore(ctx context.Context, d DataURL, compression string, cacheSize int64) (*blockStore, error) {
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{},
	})
	c, err := minio.New(d.Endpoint, &minio.Options{Creds: creds, Secure: d.Secure, Region: os.Getenv("AWS_REGION")})
	if err != nil {
		return nil, fmt.Errorf("S3 %s: %v", d, err)
	}
	s := &blockStore{c: c, d: d, cache: newBlockCache(cacheSize)}
	s.fetches.init()
	switch compression {
	case "", "none":
	case "zstd":
		s.zstd = true
		s.enc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		s.dec, _ = zstd.NewReader(nil)
	default:
		return nil, fmt.Errorf("unknown compression %q (none or zstd)", compression)
	}
	return s, nil
}

// errUnreachable is a check that had no answer from the server.
var errUnreachable = errors.New("no answer")

// check tells whether the bucket is there and ours to use.
func (s *blockStore) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ok, err := s.c.BucketExists(ctx, s.d.Bucket)
	if err != nil && minio.ToErrorResponse(err).StatusCode == 0 {
		return fmt.Errorf("S3 %s: %w: %v (is the server up?)", s.d, errUnreachable, err)
	}
	if err != nil {
		return fmt.Errorf("S3 %s: %v (check the endpoint and the AWS credentials)", s.d, err)
	}
	if !ok {
		return fmt.Errorf("S3 %s: no bucket %s: make it first", s.d, s.d.Bucket)
	}
	return nil
}

// key is where object id lives: PREFIX/blocks/ID[:2]/ID, spread over 256
// directories for stores that keep a directory's names in one place.
func (s *blockStore) key(id string) string { return s.blocksPrefix() + id[:2] + "/" + id }

func (s *blockStore) blocksPrefix() string {
	if s.d.Prefix != "" {
		return s.d.Prefix + "/blocks/"
	}
	return "blocks/"
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hexenc.EncodeToString(b[:])
}

// put stores data as a new object and returns its id.
func (s *blockStore) put(ctx context.Context, data []byte) (string, error) {
	id := newID()
	body := data
	if s.zstd {
		body = s.enc.EncodeAll(data, nil)
	}
	err := retry(ctx, func() error {
		_, err := s.c.PutObject(ctx, s.d.Bucket, s.key(id), bytes.NewReader(body), int64(len(body)),
			minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true})
		return err
	})
	if err != nil {
		return "", err
	}
	s.keep(id, data)
	return id, nil
}

// get returns the bytes of object id, of which the caller needs the
// first want (the block list's length of it): a cached copy shorter than
// that is not the block, and is fetched again.
func (s *blockStore) get(ctx context.Context, id string, want int) ([]byte, error) {
	if b, ok := s.cache.get(id); ok && len(b) >= want {
		return b, nil
	}
	return s.once(ctx, id, want)
}

// load reads block id from the disk cache, or else from S3.
func (s *blockStore) load(ctx context.Context, id string, want int) ([]byte, error) {
	if s.disk != nil {
		if b, ok := s.disk.get(id, want); ok {
			s.cache.add(id, b)
			return b, nil
		}
	}
	return s.fetch(ctx, id)
}

// fetch reads object id from S3 and caches it.
func (s *blockStore) fetch(ctx context.Context, id string) ([]byte, error) {
	var b []byte
	s.fetches.gets.Add(1) // a block fetched, however many tries it takes
	err := retry(ctx, func() error {
		o, err := s.c.GetObject(ctx, s.d.Bucket, s.key(id), minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer o.Close()
		b, err = io.ReadAll(o)
		return err
	})
	if err != nil {
		return nil, err
	}
	if s.zstd {
		if b, err = s.dec.DecodeAll(b, nil); err != nil {
			return nil, fmt.Errorf("block %s: %v", id, err)
		}
	}
	s.keep(id, b)
	return b, nil
}

// keep caches block id in memory and on disk.
func (s *blockStore) keep(id string, b []byte) {
	s.cache.add(id, b)
	if s.disk != nil {
		s.disk.add(id, b)
	}
}

// close saves the disk cache's index, for the next mount.
func (s *blockStore) close() error {
	s.fetches.stop()
	if s.disk == nil {
		return nil
	}
	return s.disk.close()
}

// retry runs op until it succeeds, fails for good (the server answered
// no), or ctx ends: an S3 server that is gone for a while (restarting,
// unreachable) holds up reads and write-backs rather than failing them.
func retry(ctx context.Context, op func() error) error {
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		err := op()
		if code := minio.ToErrorResponse(err).StatusCode; err == nil || code != 0 && code < 500 {
			return err // done, or an answer (no such key, denied...)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

func (s *blockStore) remove(ctx context.Context, id string) error {
	s.cache.drop(id)
	if s.disk != nil {
		s.disk.drop(id)
	}
	return s.c.RemoveObject(ctx, s.d.Bucket, s.key(id), minio.RemoveObjectOptions{})
}

// blockCache keeps recently used blocks in memory, least recently used
// out first. Blocks never change, so nothing is ever invalidated.
type blockCache struct {
	mu   sync.Mutex
	max  int64
	size int64
	lru  list.List // of *cached, most recent at the front
	byID map[string]*list.Element
}

type cached struct {
	id   string
	data []byte
}

func newBlockCache(max int64) *blockCache {
	return &blockCache{max: max, byID: map[string]*list.Element{}}
}

func (c *blockCache) get(id string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[id]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*cached).data, true
}

func (c *blockCache) has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.byID[id]
	return ok
}

func (c *blockCache) add(id string, data []byte) {
	if int64(len(data)) > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byID[id]; ok {
		return
	}
	c.byID[id] = c.lru.PushFront(&cached{id, data})
	c.size += int64(len(data))
	for c.size > c.max {
		e := c.lru.Back()
		old := e.Value.(*cached)
		c.lru.Remove(e)
		delete(c.byID, old.id)
		c.size -= int64(len(old.data))
	}
}

func (c *blockCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byID[id]; ok {
		c.lru.Remove(e)
		delete(c.byID, id)
		c.size -= int64(len(e.Value.(*cached).data))
	}
}
