package p9wire

import (
	"encoding/binary"
	"testing"
)

// A count larger than the body is an error, read as nothing: no buffer of
// the wire's size is made (a short Twrite of count 0xFFFFFFFF made 4 GiB).
func TestShortBody(t *testing.T) {
	for _, count := range []uint32{5, 1 << 20, 1<<31 + 1, ^uint32(0)} {
		b := binary.LittleEndian.AppendUint32(nil, count)
		b = append(b, "abc"...)
		d := Dec{B: b}
		if p := d.Bytes(); d.Err == nil || len(p) != 0 || cap(p) != 0 {
			t.Errorf("Bytes with count %d over 3 bytes: len %d cap %d, err %v", count, len(p), cap(p), d.Err)
		}
		// Fixed-width fields after the error read as zeros.
		if v := d.U64(); v != 0 || d.Err == nil {
			t.Errorf("U64 after a short body: %d %v", v, d.Err)
		}
	}
	d := Dec{B: []byte("abc")}
	if p := d.Take(1 << 20); d.Err == nil || cap(p) != 0 {
		t.Errorf("Take(1<<20) of 3 bytes: cap %d, err %v", cap(p), d.Err)
	}
	d = Dec{B: []byte("abc")}
	if p := d.Take(-1); d.Err == nil || p != nil {
		t.Errorf("Take(-1): %v %v", p, d.Err)
	}
	// A string longer than the body.
	d = Dec{B: []byte{200, 0, 'x'}}
	if s := d.Str(); s != "" || d.Err == nil {
		t.Errorf("short Str: %q %v", s, d.Err)
	}
	// Whole fields read as before.
	e := Msg(Twrite, 1)
	e.U8(7)
	e.U16(0x1234)
	e.U64(1 << 40)
	e.Str("name")
	e.Bytes([]byte("data"))
	d = Dec{B: e.Frame()[HdrLen:]}
	if a, b, c, s, p := d.U8(), d.U16(), d.U64(), d.Str(), d.Bytes(); d.Err != nil || a != 7 || b != 0x1234 || c != 1<<40 || s != "name" || string(p) != "data" || len(d.B) != 0 {
		t.Errorf("round trip: %d %x %d %q %q %v", a, b, c, s, p, d.Err)
	}
	// A fixed field past the end.
	d = Dec{B: []byte{1, 2, 3}}
	if v := d.U32(); v != 0 || d.Err == nil {
		t.Errorf("U32 of 3 bytes: %d %v", v, d.Err)
	}
}
