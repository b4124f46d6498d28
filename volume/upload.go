package volume

import (
	"context"
	"sync"
)

// uploads bounds the blocks one write-back puts at once: S3 takes many
// requests in parallel, and one at a time leaves its bandwidth idle
// (a 4 MiB block is one round trip of a few tens of milliseconds).
const uploads = 8

// putAll stores the non-empty blocks of snap as new objects, up to
// uploads at once, and returns the block each becomes (an empty one a
// hole). The first error stops those not yet started.
func (s *blockStore) putAll(ctx context.Context, snap map[int64][]byte) (map[int64]Block, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(map[int64]Block, len(snap))
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	slots := make(chan struct{}, uploads)
	for i, buf := range snap {
		if len(buf) == 0 {
			mu.Lock()
			out[i] = Block{}
			mu.Unlock()
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			id, err := s.put(ctx, buf)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				cancel()
				return
			}
			out[i] = Block{ID: id, Len: uint32(len(buf))}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}
