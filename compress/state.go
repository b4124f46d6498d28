package compress

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
)

// fstate is what the layer knows of one file, shared by every node and
// handle of it (all views of the layer, all hard links): its header, its
// table and its free space, kept while a node holds the file and checked
// against the lower file's attributes before each use, so that a change
// made beneath the layer is read again.
type fstate struct {
	tok  layer.Token
	refs int // nodes holding it, under fs.mu

	// mu orders reads (shared) and updates (exclusive) of the file in
	// this layer. It is the layer's own, not the stack's data lock: the
	// layer beneath (crypt, on wrap) takes that one for the same token.
	mu sync.RWMutex

	// Under mu. known: the fields below describe the lower file whose
	// attributes were fp.
	known   bool
	fp      fingerprint
	kind    fileKind
	hdr     header
	table   bool    // ents and sp are loaded
	ents    []entry // the table as stored, tableCap long
	sp      space
	lowerSz uint64 // the lower file's size
}

type fileKind uint8

const (
	kindEmpty   fileKind = iota // an empty lower file: an empty file
	kindCompr                   // a compressed file
	kindPlain                   // a plain file (no magic): served as it is
	kindDamaged                 // the magic, but a header that does not check
)

// fingerprint is what tells the layer that the lower file changed.
type fingerprint struct {
	size         uint64
	mtime, ctime time.Time
}

func fpOf(a *layer.Attr) fingerprint { return fingerprint{a.Size, a.Mtime, a.Ctime} }

// badKind marks in memory an entry that does not check: its block reads
// as EIO until written again.
const badKind = 0xff

var log = slog.Default()

// lowerFile is the file beneath: its node, and a handle of it.
type lowerFile struct {
	n layer.Node
	h layer.Handle
}

func (lf lowerFile) attr(ctx context.Context) (layer.Attr, layer.Errno) {
	var a layer.Attr
	e := lf.n.Getattr(ctx, lf.h, &a)
	return a, e
}

func (lf lowerFile) setSize(ctx context.Context, n uint64) layer.Errno {
	var a layer.Attr
	return lf.n.Setattr(ctx, lf.h, &layer.SetAttr{Valid: layer.SetSize, Size: n}, &a)
}

// readHeader reads and classifies the lower file's header; mu is held
// exclusively. a is the lower file's attributes.
func (s *fstate) readHeader(ctx context.Context, lf lowerFile, a *layer.Attr) layer.Errno {
	s.known, s.table, s.ents, s.sp = false, false, nil, space{}
	s.fp, s.lowerSz, s.hdr = fpOf(a), a.Size, header{}
	if a.Size == 0 {
		s.kind, s.known = kindEmpty, true
		return 0
	}
	b := make([]byte, headerSize)
	k, e := readFull(ctx, lf, b, 0)
	if e != 0 {
		return e
	}
	h, err := decodeHeader(b[:k])
	switch {
	case err == errPlain:
		s.kind = kindPlain
	case err != nil:
		log.Error("compress: damaged header; reads fail with EIO", "token", s.tok, "err", err)
		s.kind = kindDamaged
	default:
		s.kind, s.hdr = kindCompr, h
	}
	s.known = true
	return 0
}

// readTable loads the table and the free space of a compressed file; mu
// is held exclusively.
func (s *fstate) readTable(ctx context.Context, lf lowerFile) layer.Errno {
	h := s.hdr
	if h.tableOff+h.tableCap*entrySize > s.lowerSz {
		log.Error("compress: the table reaches beyond the lower file", "token", s.tok, "table", h.tableOff, "entries", h.tableCap, "lower size", s.lowerSz)
		s.kind = kindDamaged
		return syscall.EIO
	}
	s.ents = make([]entry, h.tableCap)
	used := []extent{{0, headerSize}, {h.tableOff, h.tableCap * entrySize}}
	buf := make([]byte, min(h.tableCap*entrySize, 1<<20))
	for i := uint64(0); i < h.tableCap; {
		n := min(h.tableCap-i, uint64(len(buf))/entrySize)
		if _, e := readFull(ctx, lf, buf[:n*entrySize], int64(h.tableOff+i*entrySize)); e != 0 {
			return e
		}
		for j := range n {
			en, err := decodeEntry(buf[j*entrySize:])
			if err != nil {
				log.Error("compress: damaged table entry; its block reads as EIO", "token", s.tok, "block", i+j, "err", err)
				en = entry{kind: badKind}
			}
			s.ents[i+j] = en
			if en.kind == kindZstd || en.kind == kindRaw {
				used = append(used, extent{en.off, uint64(en.n)})
			}
		}
		i += n
	}
	s.sp = newSpace(used)
	s.table = true
	return 0
}

// readFull reads len(b) bytes at off, or up to the end of the file.
func readFull(ctx context.Context, lf lowerFile, b []byte, off int64) (int, layer.Errno) {
	done := 0
	for done < len(b) {
		k, e := lf.h.Read(ctx, b[done:], off+int64(done))
		if e != 0 {
			return done, e
		}
		if k <= 0 {
			break
		}
		done += k
	}
	return done, 0
}

// writeFull writes all of b at off.
func writeFull(ctx context.Context, lf lowerFile, b []byte, off uint64) layer.Errno {
	for done := 0; done < len(b); {
		k, e := lf.h.Write(ctx, b[done:], int64(off)+int64(done))
		if e != 0 {
			return e
		}
		if k <= 0 {
			return syscall.EIO // a lower layer that neither writes nor fails
		}
		done += k
	}
	return 0
}

// entryAt is block blk's entry as the file's size has it: blocks at or
// past the size are holes, whatever a crash left in their entries.
func (s *fstate) entryAt(blk uint64) entry {
	if blk >= uint64(len(s.ents)) || blk >= blocks(s.hdr.size) {
		return entry{}
	}
	return s.ents[blk]
}

// readBlocks returns the content of blocks first..last, each padded with
// zeros to a whole block; mu is held and the table loaded.
func (s *fstate) readBlocks(ctx context.Context, lf lowerFile, first, last uint64) ([]byte, layer.Errno) {
	out := make([]byte, (last-first+1)*blockSize)
	type job struct {
		blk    uint64
		en     entry
		stored []byte
	}
	var jobs []job
	// Read the extents, one lower read for each run of adjacent ones (a
	// file written in order is one run).
	for b := first; b <= last; {
		en := s.entryAt(b)
		if en.kind == kindHole {
			b++
			continue
		}
		if en.kind == badKind {
			return nil, syscall.EIO
		}
		run := []job{{b, en, nil}}
		end := en.off + uint64(en.n)
		for b++; b <= last; b++ {
			nx := s.entryAt(b)
			if (nx.kind != kindZstd && nx.kind != kindRaw) || nx.off != end {
				break
			}
			run = append(run, job{b, nx, nil})
			end += uint64(nx.n)
		}
		buf := make([]byte, end-en.off)
		k, e := readFull(ctx, lf, buf, int64(en.off))
		if e != 0 {
			return nil, e
		}
		buf = buf[:k]
		for i := range run {
			o := run[i].en.off - en.off
			run[i].stored = buf[min(o, uint64(len(buf))):min(o+uint64(run[i].en.n), uint64(len(buf)))]
		}
		jobs = append(jobs, run...)
	}
	errs := make([]error, len(jobs))
	parallel(len(jobs), func(i int) {
		j := jobs[i]
		p, err := decodeBlock(j.blk, j.en, j.stored)
		if err == nil {
			copy(out[(j.blk-first)*blockSize:(j.blk-first+1)*blockSize], p)
		}
		errs[i] = err
	})
	for i, err := range errs {
		if err != nil {
			log.Error("compress: block does not check; the read fails with EIO", "token", s.tok, "block", jobs[i].blk, "err", err)
			return nil, syscall.EIO
		}
	}
	return out, 0
}

// parallel runs fn(0..n-1) on up to one goroutine per CPU.
func parallel(n int, fn func(i int)) {
	w := min(n, runtime.GOMAXPROCS(0))
	if w <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range w {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	wg.Wait()
}
