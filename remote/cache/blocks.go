package cache

import (
	"container/list"
	"fmt"
	"sync"
)

type blockKey struct {
	path, gen uint64
	idx       int64
}

// MemBlocks keeps file data in memory, the least recently used going
// first past max bytes.
type MemBlocks struct {
	mu    sync.Mutex
	m     map[blockKey]*list.Element
	lru   list.List // *memBlock
	used  int64
	limit int64
}

type memBlock struct {
	k blockKey
	b []byte
}

func NewMemBlocks(limit int64) *MemBlocks {
	return &MemBlocks{m: map[blockKey]*list.Element{}, limit: limit}
}

func (s *MemBlocks) get(path, gen uint64, idx int64) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el := s.m[blockKey{path, gen, idx}]
	if el == nil {
		return nil, false
	}
	s.lru.MoveToBack(el)
	return el.Value.(*memBlock).b, true
}

func (s *MemBlocks) put(path, gen uint64, idx int64, b []byte) bool {
	if int64(len(b)) > s.limit {
		return false
	}
	k := blockKey{path, gen, idx}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(k)
	s.m[k] = s.lru.PushBack(&memBlock{k, append([]byte(nil), b...)})
	s.used += int64(len(b))
	for s.used > s.limit {
		s.dropLocked(s.lru.Front().Value.(*memBlock).k)
	}
	return true
}

func (s *MemBlocks) drop(path, gen uint64, idx int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(blockKey{path, gen, idx})
}

func (s *MemBlocks) dropLocked(k blockKey) {
	if el := s.m[k]; el != nil {
		s.used -= int64(len(el.Value.(*memBlock).b))
		s.lru.Remove(el)
		delete(s.m, k)
	}
}

func (s *MemBlocks) bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// blockName is a block's key in the object store.
func blockName(path, gen uint64, idx int64) string {
	return fmt.Sprintf("d:%x:%x:%x", path, gen, idx)
}
