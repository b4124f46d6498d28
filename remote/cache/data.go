package cache

// Read fills dest from the cached blocks of path, generation gen, at off.
// ok=false is a miss: some block it needs is not cached. The blocks of
// another generation are another file's (the inode number was reused
// after the file, still open here, was removed): a miss, not its data.
func (c *Cache) Read(path, gen uint64, dest []byte, off int64) (int, bool) {
	if !c.On.Load() {
		return 0, false
	}
	c.mu.Lock()
	e := c.getLocked(path)
	if e == nil || e.gen != gen {
		c.mu.Unlock()
		return 0, false
	}
	type part struct {
		idx int64
		l   int
	}
	var parts []part
	for at := off; at < off+int64(len(dest)); {
		idx := at / BlockSize
		l, ok := e.blks[idx]
		if !ok {
			c.mu.Unlock()
			return 0, false
		}
		parts = append(parts, part{idx, l})
		if l < BlockSize {
			break
		}
		at = (idx + 1) * BlockSize
	}
	c.mu.Unlock()
	total := 0
	for _, p := range parts {
		b, ok := c.blocks.get(path, gen, p.idx)
		if !ok || len(b) != p.l {
			c.forgetBlock(path, gen, p.idx)
			return 0, false
		}
		start := max(off+int64(total)-p.idx*BlockSize, 0)
		if start >= int64(len(b)) {
			break
		}
		total += copy(dest[total:], b[start:])
	}
	return total, true
}

// forgetBlock notes that the store no longer has a block.
func (c *Cache) forgetBlock(path, gen uint64, idx int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[path]; e != nil && e.gen == gen {
		delete(e.blks, idx)
	}
}

// PutData keeps data read from path at off, a multiple of BlockSize;
// eof tells that it ends at the end of the file.
func (c *Cache) PutData(since, path, gen uint64, off int64, data []byte, eof bool) {
	c.put(since, path, gen, func(e *centry) {
		for i := 0; i < len(data) || eof && i == len(data); i += BlockSize {
			b := data[i:min(i+BlockSize, len(data))]
			if len(b) < BlockSize && !eof {
				break
			}
			idx := (off + int64(i)) / BlockSize
			if c.blocks.put(path, e.gen, idx, b) {
				if e.blks == nil {
					e.blks = map[int64]int{}
				}
				e.blks[idx] = len(b)
			}
			if len(b) < BlockSize {
				break
			}
		}
	})
}
