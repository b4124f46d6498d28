package journal

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/shalefs/shale/p9wire"
)

var samples = []Record{
	{Kind: Change, Epoch: 7, Seq: 1, Qid: p9wire.Qid{Type: p9wire.QTDir, Vers: 3, Path: 42},
		Fields: []Field{{Type: Entry, Op: EntryAdded, Name: "a name"}, {Type: Attrs}}},
	{Kind: Change, Epoch: 7, Seq: 2, Qid: p9wire.Qid{Path: 1 << 60},
		Fields: []Field{{Type: Data, Off: 4096, Len: 10}, {Type: 99, Raw: []byte("future")}}},
	{Kind: Reset, Epoch: 7, Seq: 3},
	{Kind: Dropped, Qid: p9wire.Qid{Path: 5}},
}

func TestRoundTrip(t *testing.T) {
	var b []byte
	for i := range samples {
		b = Append(b, &samples[i])
	}
	for i := range samples {
		r, rest, err := Next(b)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !reflect.DeepEqual(r, samples[i]) {
			t.Errorf("record %d: %+v, want %+v", i, r, samples[i])
		}
		if Size(&samples[i]) != len(b)-len(rest) {
			t.Errorf("record %d: Size %d, took %d", i, Size(&samples[i]), len(b)-len(rest))
		}
		b = rest
	}
	if len(b) != 0 {
		t.Errorf("%d bytes left", len(b))
	}
	if !samples[0].Known() || samples[1].Known() {
		t.Error("Known: a record with a field of an unknown type must not be known, others must")
	}
}

// The wire form, byte for byte: other implementations follow this.
func TestWireForm(t *testing.T) {
	r := Record{Kind: Change, Epoch: 1, Seq: 2, Qid: p9wire.Qid{Type: 0x80, Vers: 3, Path: 4},
		Fields: []Field{{Type: Data, Off: 5, Len: 6}, {Type: Entry, Op: EntryRemoved, Name: "x"}}}
	want := []byte{
		54, 0, 0, 0, // size
		1,                      // kind
		1, 0, 0, 0, 0, 0, 0, 0, // epoch
		2, 0, 0, 0, 0, 0, 0, 0, // seq
		0x80, 3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, // qid
		2, 16, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, // data
		3, 2, 0, 2, 'x', // entry
	}
	if got := Append(nil, &r); !bytes.Equal(got, want) {
		t.Errorf("wire form\n got %v\nwant %v", got, want)
	}
}

func TestMalformed(t *testing.T) {
	good := Append(nil, &samples[1])
	bad := map[string][]byte{
		"empty":          nil,
		"short header":   good[:20],
		"cut":            good[:len(good)-1],
		"size too small": append([]byte{1, 0, 0, 0}, good[4:]...),
		"huge size":      append([]byte{0xff, 0xff, 0xff, 0x7f}, good[4:]...),
		"field cut":      Append(nil, &Record{Kind: Change})[:0],
	}
	// A field whose size runs past the record.
	f := Append(nil, &Record{Kind: Change, Fields: []Field{{Type: Attrs}}})
	f[len(f)-2] = 9
	bad["field past record"] = f
	// A Data field of the wrong size.
	d := Append(nil, &Record{Kind: Change, Fields: []Field{{Type: 99, Raw: []byte{1, 2, 3}}}})
	d[recordHdr] = byte(Data)
	bad["short data field"] = d
	e := Append(nil, &Record{Kind: Change, Fields: []Field{{Type: Entry, Op: EntryAdded}}})
	bad["entry without a name"] = e
	for name, b := range bad {
		if _, _, err := Next(b); err != ErrFormat {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

func FuzzNext(f *testing.F) {
	for i := range samples {
		f.Add(Append(nil, &samples[i]))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, rest, err := Next(b)
		if err != nil {
			return
		}
		// What decodes encodes back to the same bytes.
		if got := Append(nil, &r); !bytes.Equal(got, b[:len(b)-len(rest)]) {
			t.Fatalf("re-encoded %x, read %x", got, b[:len(b)-len(rest)])
		}
	})
}
