package p9wire

import (
	"reflect"
	"testing"
	"time"

	"github.com/shalefs/shale/layer"
)

// Every message decodes to what was encoded, and its frame has its type.
func TestMessagesRoundTrip(t *testing.T) {
	q := Qid{Type: QTDir, Vers: 7, Path: 1 << 40}
	at := time.Unix(1700000000, 123)
	msgs := []Message{
		&VersionReq{Msize: 8192, Version: Version}, &VersionReply{Msize: 4096, Version: Version},
		&Auth{Afid: 3, Uname: "u", Aname: "a", NUname: 1000},
		&Attach{Fid: 1, Afid: NoFid, Uname: "root", Aname: "/x", NUname: 0}, &QidReply{T: Tattach, Qid: q},
		&NoReply{T: Tclunk}, &Flush{OldTag: 9},
		&Walk{Fid: 1, NewFid: 2, Names: []string{"a", "bb"}}, &WalkReply{Qids: []Qid{q, q}},
		&Getattr{Fid: 4, Mask: GetattrAll},
		&Rattr{Valid: GetattrAll, Qid: q, Attr: layer.Attr{Ino: q.Path, Mode: 0o100644, Uid: 1, Gid: 2, Nlink: 3, Size: 5, Blksize: 4096, Blocks: 8, Atime: at, Mtime: at, Ctime: at}, Gen: 11},
		&Setattr{Fid: 1, Valid: SetattrMode | SetattrSize, Mode: 0o600, Uid: 5, Gid: 6, Size: 99, Atime: 1, AtimeNsec: 2, Mtime: 3, MtimeNsec: 4},
		&Lopen{Fid: 1, Flags: 2}, &OpenReply{T: Tlcreate, Qid: q, Iounit: 65536},
		&Lcreate{Fid: 1, Name: "n", Flags: 0o1, Mode: 0o644, Gid: 7},
		&Mkdir{Dfid: 1, Name: "d", Mode: 0o755, Gid: 3},
		&Mknod{Dfid: 1, Name: "p", Mode: 0o10644, Major: 1, Minor: 2, Gid: 3},
		&Symlink{Fid: 1, Name: "s", Target: "../t", Gid: 3}, &Link{Dfid: 1, Fid: 2, Name: "l"},
		&Rename{Fid: 1, Dfid: 2, Name: "r"}, &Renameat{OldDfid: 1, OldName: "a", NewDfid: 2, NewName: "b"},
		&Unlinkat{Dfid: 1, Name: "u", Flags: 0x200}, &FidReq{T: Tclunk, Fid: 5},
		&ReadlinkReply{Target: "/x/y"}, &Read{T: Treaddir, Fid: 1, Offset: 3, Count: 4096},
		&DataReply{T: Tread, Data: []byte("data")}, &Write{Fid: 1, Offset: 1 << 33, Data: []byte("w")}, &WriteReply{Count: 1},
		&Fsync{Fid: 1, Datasync: true}, &Lock{Fid: 1, LockType: LockWrite, Flags: LockFlagsBlock, Start: 1, Length: 2, ProcID: 3, ClientID: "c"},
		&LockReply{Status: LockGrace}, &Getlock{Fid: 1, LockType: LockRead, Start: 1, Length: 2, ProcID: 3, ClientID: "c"},
		&Getlock{R: true, LockType: LockUnlock, Start: 1, Length: 2, ProcID: 3, ClientID: "c"},
		&Xattrwalk{Fid: 1, NewFid: 2, Name: "user.x"}, &XattrwalkReply{Size: 12},
		&Xattrcreate{Fid: 1, Name: "user.x", Size: 3, Flags: 1},
		&StatfsReply{FsType: 0x01021997, Bsize: 4096, Blocks: 1, Bfree: 2, Bavail: 3, Files: 4, Ffree: 5, Fsid: 6, Namelen: 255},
		&ErrorReply{Ecode: 2},
	}
	for _, m := range msgs {
		f := Encode(m, 42)
		if f[4] != m.Type() || len(f) < HdrLen {
			t.Errorf("%T: frame type %d, want %d", m, f[4], m.Type())
		}
		got := reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message)
		// The type-carrying fields are the caller's to set before decoding.
		reflect.ValueOf(got).Elem().Set(reflect.ValueOf(m).Elem())
		clearFields(got)
		d := &Dec{B: f[HdrLen:]}
		got.Decode(d)
		if d.Err != nil || len(d.B) != 0 {
			t.Errorf("%T: decode: %v, %d bytes left", m, d.Err, len(d.B))
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%T: decoded %+v, want %+v", m, got, m)
		}
	}
}

// clearFields zeroes what Decode fills, keeping the fields the caller
// sets (T, R) that tell one message of a shared type from another.
func clearFields(m Message) {
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		if n := v.Type().Field(i).Name; n != "T" && n != "R" {
			v.Field(i).SetZero()
		}
	}
}

// A Tfsync of a fid alone (hugelgupf/p9's) is a full sync; a short body
// of any message sets Err and allocates nothing from its counts.
func TestMessagesShort(t *testing.T) {
	var e Enc
	e.U32(7)
	var f Fsync
	d := &Dec{B: e.B}
	if f.Decode(d); d.Err != nil || f.Fid != 7 || f.Datasync {
		t.Errorf("Tfsync[fid]: %+v, %v", f, d.Err)
	}
	var w Walk
	e = Enc{}
	e.U32(1)
	e.U32(2)
	e.U16(60000)
	d = &Dec{B: e.B}
	if w.Decode(d); d.Err == nil {
		t.Errorf("a Twalk of 60000 names decoded: %+v", w)
	}
	var r DataReply
	d = &Dec{B: []byte{0xff, 0xff, 0xff, 0xff}}
	if r.Decode(d); d.Err == nil || r.Data != nil {
		t.Errorf("an Rread claiming 4 GiB decoded: %d bytes, %v", len(r.Data), d.Err)
	}
}
