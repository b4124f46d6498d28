package objstore

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// Request is one line of a `time id size` trace.
type Request struct {
	Key  string
	Size int
}

// TraceReader reads a `time id size` trace, plain or compressed with xz or
// gzip (told apart by their magic bytes, not the file name).
type TraceReader struct {
	sc   *bufio.Scanner
	line int
}

// NewTraceReader starts reading a trace from r.
func NewTraceReader(r io.Reader) (*TraceReader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, _ := br.Peek(6)
	var src io.Reader = br
	switch {
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		x, err := xz.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace is not valid xz: %w", err)
		}
		src = x
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		g, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace is not valid gzip: %w", err)
		}
		src = g
	}
	return &TraceReader{sc: bufio.NewScanner(src)}, nil
}

// Line is the number of the line Next last read.
func (t *TraceReader) Line() int { return t.line }

// Next returns the next request, io.EOF at the end, or an error naming the
// line that does not parse.
func (t *TraceReader) Next() (Request, error) {
	for t.sc.Scan() {
		t.line++
		f := strings.Fields(t.sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return Request{}, fmt.Errorf("trace line %d: want `time id size`, got %q", t.line, t.sc.Text())
		}
		size, err := strconv.Atoi(f[2])
		if err != nil || size < 0 {
			return Request{}, fmt.Errorf("trace line %d: size %q is not a byte count", t.line, f[2])
		}
		return Request{Key: f[1], Size: size}, nil
	}
	if err := t.sc.Err(); err != nil {
		return Request{}, fmt.Errorf("trace line %d: %w", t.line+1, err)
	}
	return Request{}, io.EOF
}
