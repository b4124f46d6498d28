package objstore

// chunkBits sets the chunk size of chunked arrays: 4096 elements.
const chunkBits = 12

// chunked is a growable array that grows one fixed chunk at a time and never
// copies. A slice grows by about 25% and copies; for an index that must stay
// under 32 bytes per object, that slack alone would eat the budget. Here the
// slack is at most one chunk.
type chunked[T any] struct {
	chunks [][]T
}

// at returns element i, which must be below the length reached by grow.
func (c *chunked[T]) at(i uint32) *T {
	return &c.chunks[i>>chunkBits][i&(1<<chunkBits-1)]
}

// grow makes element i addressable.
func (c *chunked[T]) grow(i uint32) {
	for int(i>>chunkBits) >= len(c.chunks) {
		c.chunks = append(c.chunks, make([]T, 1<<chunkBits))
	}
}
