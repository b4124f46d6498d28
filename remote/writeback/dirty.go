package writeback

import (
	"slices"
	"time"
)

// dirty is the data of one file written by programs and not yet written
// back to the server (delayed write): extents sorted by
// offset, neither overlapping nor touching, and the size the file has
// for this client.
type dirty struct {
	ext   []extent
	size  int64
	since time.Time // when it became dirty: write-back is due delay after
	mtime time.Time // the last write, or the time set; shown by stat until written back
	ctime time.Time // the last change kept: a write, or a setting of times

	// Times a program set (utimes) while the data was delayed, sent
	// after it (KeepTimes): by timesBy; atime zero if not set; mtimeSet
	// if mtime is the one set, not moved by a write since.
	timesSet bool
	timesBy  uint32
	atime    time.Time
	mtimeSet bool
}

type extent struct {
	off  int64
	data []byte
}

func (e extent) end() int64 { return e.off + int64(len(e.data)) }

// bytes is how much data d holds.
func (d *dirty) bytes() int64 {
	var n int64
	for _, e := range d.ext {
		n += int64(len(e.data))
	}
	return n
}

// write stores p at off, merging it with the extents it overlaps or
// touches, and returns how many bytes it added to d and how many of d's
// it replaced (which will never reach the server).
func (d *dirty) write(off int64, p []byte) (added, replaced int64) {
	end := off + int64(len(p))
	// The extents from i to j-1 overlap or touch [off, end).
	i, _ := slices.BinarySearchFunc(d.ext, off, func(e extent, off int64) int {
		if e.end() < off {
			return -1
		}
		return 1
	})
	j := i
	start, last := off, end
	for j < len(d.ext) && d.ext[j].off <= end {
		e := d.ext[j]
		lo, hi := max(e.off, off), min(e.end(), end)
		if hi > lo {
			replaced += hi - lo
		}
		start, last = min(start, e.off), max(last, e.end())
		j++
	}
	merged := make([]byte, last-start)
	for _, e := range d.ext[i:j] {
		copy(merged[e.off-start:], e.data)
	}
	copy(merged[off-start:], p)
	before := int64(0)
	for _, e := range d.ext[i:j] {
		before += int64(len(e.data))
	}
	d.ext = slices.Replace(d.ext, i, j, extent{start, merged})
	d.size = max(d.size, end)
	return int64(len(merged)) - before, replaced
}

// truncate cuts d at size and returns the bytes it dropped.
func (d *dirty) truncate(size int64) (dropped int64) {
	keep := d.ext[:0]
	for _, e := range d.ext {
		switch {
		case e.off >= size:
			dropped += int64(len(e.data))
		case e.end() > size:
			dropped += e.end() - size
			keep = append(keep, extent{e.off, e.data[:size-e.off]})
		default:
			keep = append(keep, e)
		}
	}
	d.ext = keep
	d.size = size
	return dropped
}

// covers tells whether the extents hold all of [off, off+n).
func (d *dirty) covers(off, n int64) bool {
	for _, e := range d.ext {
		if e.off <= off && e.end() >= off+n {
			return true
		}
	}
	return n == 0
}

// overlay copies what d holds of [off, off+len(dest)) into dest.
func (d *dirty) overlay(dest []byte, off int64) {
	end := off + int64(len(dest))
	for _, e := range d.ext {
		lo, hi := max(e.off, off), min(e.end(), end)
		if hi > lo {
			copy(dest[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
		}
	}
}

// accessed moves a kept atime to now at a read (not with O_NOATIME),
// as relatime would: if it is not after mtime or ctime, or a day old.
func (d *dirty) accessed(noatime bool) {
	if noatime || d.atime.IsZero() {
		return
	}
	now := time.Now()
	if !d.atime.After(d.mtime) || !d.atime.After(d.ctime) || now.Sub(d.atime) > 24*time.Hour {
		d.atime = now
	}
}
