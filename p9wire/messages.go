package p9wire

// The messages of 9P2000.L, one type each, as hugelgupf/p9's messages.go
// has them: the client (remote) and the server (export) build and read
// bodies only through these, so the layout of each is written once.
// Decode never fails by itself: a short body sets the Dec's Err, which the
// caller checks once.

// A Message is the body of one 9P2000.L message.
type Message interface {
	Type() uint8
	Encode(e *Enc)
	Decode(d *Dec)
}

// Encode is m framed with tag, ready for the wire.
func Encode(m Message, tag uint16) []byte {
	e := Msg(m.Type(), tag)
	m.Encode(e)
	return e.Frame()
}

// VersionReq and VersionReply negotiate the message size and the protocol.
type VersionReq struct {
	Msize   uint32
	Version string
}

func (*VersionReq) Type() uint8     { return Tversion }
func (m *VersionReq) Encode(e *Enc) { e.U32(m.Msize); e.Str(m.Version) }
func (m *VersionReq) Decode(d *Dec) { m.Msize, m.Version = d.U32(), d.Str() }

type VersionReply VersionReq

func (*VersionReply) Type() uint8     { return Tversion + 1 }
func (m *VersionReply) Encode(e *Enc) { (*VersionReq)(m).Encode(e) }
func (m *VersionReply) Decode(d *Dec) { (*VersionReq)(m).Decode(d) }

// Auth asks for an authentication fid; QidReply has its QID.
type Auth struct {
	Afid         uint32
	Uname, Aname string
	NUname       uint32
}

func (*Auth) Type() uint8 { return Tauth }
func (m *Auth) Encode(e *Enc) {
	e.U32(m.Afid)
	e.Str(m.Uname)
	e.Str(m.Aname)
	e.U32(m.NUname)
}
func (m *Auth) Decode(d *Dec) {
	m.Afid, m.Uname, m.Aname = d.U32(), d.Str(), d.Str()
	m.NUname = d.U32()
}

// Attach attaches Fid to the tree Aname as the user NUname (Uname its
// name, for servers that look users up by name).
type Attach struct {
	Fid, Afid    uint32
	Uname, Aname string
	NUname       uint32
}

func (*Attach) Type() uint8 { return Tattach }
func (m *Attach) Encode(e *Enc) {
	e.U32(m.Fid)
	e.U32(m.Afid)
	e.Str(m.Uname)
	e.Str(m.Aname)
	e.U32(m.NUname)
}
func (m *Attach) Decode(d *Dec) {
	m.Fid, m.Afid = d.U32(), d.U32()
	m.Uname, m.Aname = d.Str(), d.Str()
	m.NUname = d.U32()
}

// QidReply is the reply of the messages that answer a QID alone: Rattach,
// Rmkdir, Rmknod, Rsymlink.
type QidReply struct {
	T   uint8 // the request's type
	Qid Qid
}

func (m *QidReply) Type() uint8   { return m.T + 1 }
func (m *QidReply) Encode(e *Enc) { e.Qid(m.Qid) }
func (m *QidReply) Decode(d *Dec) { m.Qid = d.Qid() }

// NoReply is the reply of the messages that answer nothing but success.
type NoReply struct{ T uint8 }

func (m *NoReply) Type() uint8 { return m.T + 1 }
func (*NoReply) Encode(*Enc)   {}
func (*NoReply) Decode(*Dec)   {}

// Flush aborts the request tagged OldTag.
type Flush struct{ OldTag uint16 }

func (*Flush) Type() uint8     { return Tflush }
func (m *Flush) Encode(e *Enc) { e.U16(m.OldTag) }
func (m *Flush) Decode(d *Dec) { m.OldTag = d.U16() }

// Walk walks Fid to NewFid by Names (at most MaxWelem); WalkReply has the
// QID of each name walked.
type Walk struct {
	Fid, NewFid uint32
	Names       []string
}

func (*Walk) Type() uint8 { return Twalk }
func (m *Walk) Encode(e *Enc) {
	e.U32(m.Fid)
	e.U32(m.NewFid)
	e.U16(uint16(len(m.Names)))
	for _, n := range m.Names {
		e.Str(n)
	}
}
func (m *Walk) Decode(d *Dec) {
	m.Fid, m.NewFid = d.U32(), d.U32()
	n := int(d.U16())
	if n > MaxWelem {
		d.Err = ErrProto
		return
	}
	m.Names = make([]string, 0, n)
	for range n {
		m.Names = append(m.Names, d.Str())
	}
}

type WalkReply struct{ Qids []Qid }

func (*WalkReply) Type() uint8 { return Twalk + 1 }
func (m *WalkReply) Encode(e *Enc) {
	e.U16(uint16(len(m.Qids)))
	for _, q := range m.Qids {
		e.Qid(q)
	}
}
func (m *WalkReply) Decode(d *Dec) {
	n := int(d.U16())
	if n > MaxWelem {
		d.Err = ErrProto
		return
	}
	m.Qids = make([]Qid, 0, n)
	for range n {
		m.Qids = append(m.Qids, d.Qid())
	}
}

// Getattr asks for the attributes in Mask; Rattr (Rgetattr) has them.
type Getattr struct {
	Fid  uint32
	Mask uint64
}

func (*Getattr) Type() uint8     { return Tgetattr }
func (m *Getattr) Encode(e *Enc) { e.U32(m.Fid); e.U64(m.Mask) }
func (m *Getattr) Decode(d *Dec) { m.Fid, m.Mask = d.U32(), d.U64() }

func (*Rattr) Type() uint8     { return Tgetattr + 1 }
func (r *Rattr) Encode(e *Enc) { e.Getattr(r) }
func (r *Rattr) Decode(d *Dec) { *r = d.Getattr() }

// Setattr sets the attributes Valid names (Setattr* bits).
type Setattr struct {
	Fid, Valid, Mode, Uid, Gid uint32
	Size                       uint64
	Atime, AtimeNsec           uint64
	Mtime, MtimeNsec           uint64
}

func (*Setattr) Type() uint8 { return Tsetattr }
func (m *Setattr) Encode(e *Enc) {
	e.U32(m.Fid)
	e.U32(m.Valid)
	e.U32(m.Mode)
	e.U32(m.Uid)
	e.U32(m.Gid)
	e.U64(m.Size)
	e.U64(m.Atime)
	e.U64(m.AtimeNsec)
	e.U64(m.Mtime)
	e.U64(m.MtimeNsec)
}
func (m *Setattr) Decode(d *Dec) {
	m.Fid, m.Valid, m.Mode, m.Uid, m.Gid = d.U32(), d.U32(), d.U32(), d.U32(), d.U32()
	m.Size = d.U64()
	m.Atime, m.AtimeNsec, m.Mtime, m.MtimeNsec = d.U64(), d.U64(), d.U64(), d.U64()
}

// Lopen opens Fid with 9P2000.L's Flags (WireFlags); OpenReply has the
// file's QID and iounit (Rlopen, and Rlcreate for the file it made).
type Lopen struct{ Fid, Flags uint32 }

func (*Lopen) Type() uint8     { return Tlopen }
func (m *Lopen) Encode(e *Enc) { e.U32(m.Fid); e.U32(m.Flags) }
func (m *Lopen) Decode(d *Dec) { m.Fid, m.Flags = d.U32(), d.U32() }

type OpenReply struct {
	T      uint8 // Tlopen or Tlcreate
	Qid    Qid
	Iounit uint32
}

func (m *OpenReply) Type() uint8   { return m.T + 1 }
func (m *OpenReply) Encode(e *Enc) { e.Qid(m.Qid); e.U32(m.Iounit) }
func (m *OpenReply) Decode(d *Dec) { m.Qid, m.Iounit = d.Qid(), d.U32() }

// Lcreate makes Name in the directory Fid and opens it through Fid.
type Lcreate struct {
	Fid              uint32
	Name             string
	Flags, Mode, Gid uint32
}

func (*Lcreate) Type() uint8 { return Tlcreate }
func (m *Lcreate) Encode(e *Enc) {
	e.U32(m.Fid)
	e.Str(m.Name)
	e.U32(m.Flags)
	e.U32(m.Mode)
	e.U32(m.Gid)
}
func (m *Lcreate) Decode(d *Dec) {
	m.Fid, m.Name = d.U32(), d.Str()
	m.Flags, m.Mode, m.Gid = d.U32(), d.U32(), d.U32()
}

// Mkdir makes the directory Name in Dfid; QidReply answers.
type Mkdir struct {
	Dfid      uint32
	Name      string
	Mode, Gid uint32
}

func (*Mkdir) Type() uint8 { return Tmkdir }
func (m *Mkdir) Encode(e *Enc) {
	e.U32(m.Dfid)
	e.Str(m.Name)
	e.U32(m.Mode)
	e.U32(m.Gid)
}
func (m *Mkdir) Decode(d *Dec) { m.Dfid, m.Name, m.Mode, m.Gid = d.U32(), d.Str(), d.U32(), d.U32() }

// Mknod makes the device, fifo or socket Name in Dfid; QidReply answers.
type Mknod struct {
	Dfid                    uint32
	Name                    string
	Mode, Major, Minor, Gid uint32
}

func (*Mknod) Type() uint8 { return Tmknod }
func (m *Mknod) Encode(e *Enc) {
	e.U32(m.Dfid)
	e.Str(m.Name)
	e.U32(m.Mode)
	e.U32(m.Major)
	e.U32(m.Minor)
	e.U32(m.Gid)
}
func (m *Mknod) Decode(d *Dec) {
	m.Dfid, m.Name = d.U32(), d.Str()
	m.Mode, m.Major, m.Minor, m.Gid = d.U32(), d.U32(), d.U32(), d.U32()
}

// Symlink makes the symlink Name to Target in the directory Fid; QidReply
// answers.
type Symlink struct {
	Fid          uint32
	Name, Target string
	Gid          uint32
}

func (*Symlink) Type() uint8 { return Tsymlink }
func (m *Symlink) Encode(e *Enc) {
	e.U32(m.Fid)
	e.Str(m.Name)
	e.Str(m.Target)
	e.U32(m.Gid)
}
func (m *Symlink) Decode(d *Dec) { m.Fid, m.Name, m.Target, m.Gid = d.U32(), d.Str(), d.Str(), d.U32() }

// Link makes Name in Dfid a hard link of Fid; NoReply answers.
type Link struct {
	Dfid, Fid uint32
	Name      string
}

func (*Link) Type() uint8     { return Tlink }
func (m *Link) Encode(e *Enc) { e.U32(m.Dfid); e.U32(m.Fid); e.Str(m.Name) }
func (m *Link) Decode(d *Dec) { m.Dfid, m.Fid, m.Name = d.U32(), d.U32(), d.Str() }

// Rename moves the file Fid to Name in Dfid (older servers' rename);
// NoReply answers.
type Rename struct {
	Fid, Dfid uint32
	Name      string
}

func (*Rename) Type() uint8     { return Trename }
func (m *Rename) Encode(e *Enc) { e.U32(m.Fid); e.U32(m.Dfid); e.Str(m.Name) }
func (m *Rename) Decode(d *Dec) { m.Fid, m.Dfid, m.Name = d.U32(), d.U32(), d.Str() }

// Renameat moves OldName in OldDfid to NewName in NewDfid; NoReply
// answers.
type Renameat struct {
	OldDfid uint32
	OldName string
	NewDfid uint32
	NewName string
}

func (*Renameat) Type() uint8 { return Trenameat }
func (m *Renameat) Encode(e *Enc) {
	e.U32(m.OldDfid)
	e.Str(m.OldName)
	e.U32(m.NewDfid)
	e.Str(m.NewName)
}
func (m *Renameat) Decode(d *Dec) {
	m.OldDfid, m.OldName = d.U32(), d.Str()
	m.NewDfid, m.NewName = d.U32(), d.Str()
}

// Unlinkat removes Name from Dfid (Flags: AT_REMOVEDIR for a
// directory); NoReply answers.
type Unlinkat struct {
	Dfid  uint32
	Name  string
	Flags uint32
}

func (*Unlinkat) Type() uint8     { return Tunlinkat }
func (m *Unlinkat) Encode(e *Enc) { e.U32(m.Dfid); e.Str(m.Name); e.U32(m.Flags) }
func (m *Unlinkat) Decode(d *Dec) { m.Dfid, m.Name, m.Flags = d.U32(), d.Str(), d.U32() }

// FidReq is a request that names a fid alone: Tclunk, Tremove, Treadlink,
// Tstatfs.
type FidReq struct {
	T   uint8
	Fid uint32
}

func (m *FidReq) Type() uint8   { return m.T }
func (m *FidReq) Encode(e *Enc) { e.U32(m.Fid) }
func (m *FidReq) Decode(d *Dec) { m.Fid = d.U32() }

// ReadlinkReply is a symlink's target.
type ReadlinkReply struct{ Target string }

func (*ReadlinkReply) Type() uint8     { return Treadlink + 1 }
func (m *ReadlinkReply) Encode(e *Enc) { e.Str(m.Target) }
func (m *ReadlinkReply) Decode(d *Dec) { m.Target = d.Str() }

// Read asks for Count bytes at Offset of Fid: Tread, and Treaddir for
// directory entries. DataReply answers, with the bytes (not copied).
type Read struct {
	T      uint8 // Tread or Treaddir
	Fid    uint32
	Offset uint64
	Count  uint32
}

func (m *Read) Type() uint8   { return m.T }
func (m *Read) Encode(e *Enc) { e.U32(m.Fid); e.U64(m.Offset); e.U32(m.Count) }
func (m *Read) Decode(d *Dec) { m.Fid, m.Offset, m.Count = d.U32(), d.U64(), d.U32() }

type DataReply struct {
	T    uint8 // Tread or Treaddir
	Data []byte
}

func (m *DataReply) Type() uint8   { return m.T + 1 }
func (m *DataReply) Encode(e *Enc) { e.Bytes(m.Data) }
func (m *DataReply) Decode(d *Dec) { m.Data = d.Bytes() }

// Write writes Data at Offset of Fid; WriteReply says how much went.
type Write struct {
	Fid    uint32
	Offset uint64
	Data   []byte
}

func (*Write) Type() uint8     { return Twrite }
func (m *Write) Encode(e *Enc) { e.U32(m.Fid); e.U64(m.Offset); e.Bytes(m.Data) }
func (m *Write) Decode(d *Dec) { m.Fid, m.Offset, m.Data = d.U32(), d.U64(), d.Bytes() }

type WriteReply struct{ Count uint32 }

func (*WriteReply) Type() uint8     { return Twrite + 1 }
func (m *WriteReply) Encode(e *Enc) { e.U32(m.Count) }
func (m *WriteReply) Decode(d *Dec) { m.Count = d.U32() }

// Fsync syncs Fid. Datasync is Linux's; some clients (hugelgupf/p9's)
// send only the fid, which decodes as a full sync.
type Fsync struct {
	Fid      uint32
	Datasync bool
}

func (*Fsync) Type() uint8 { return Tfsync }
func (m *Fsync) Encode(e *Enc) {
	e.U32(m.Fid)
	if m.Datasync {
		e.U32(1)
	} else {
		e.U32(0)
	}
}
func (m *Fsync) Decode(d *Dec) {
	m.Fid = d.U32()
	m.Datasync = len(d.B) >= 4 && d.U32() != 0
}

// Lock takes or releases a lock (Lock* types); LockReply has its status.
type Lock struct {
	Fid           uint32
	LockType      uint8
	Flags         uint32
	Start, Length uint64
	ProcID        uint32
	ClientID      string
}

func (*Lock) Type() uint8 { return Tlock }
func (m *Lock) Encode(e *Enc) {
	e.U32(m.Fid)
	e.U8(m.LockType)
	e.U32(m.Flags)
	e.U64(m.Start)
	e.U64(m.Length)
	e.U32(m.ProcID)
	e.Str(m.ClientID)
}
func (m *Lock) Decode(d *Dec) {
	m.Fid, m.LockType, m.Flags = d.U32(), d.U8(), d.U32()
	m.Start, m.Length, m.ProcID, m.ClientID = d.U64(), d.U64(), d.U32(), d.Str()
}

type LockReply struct{ Status uint8 }

func (*LockReply) Type() uint8     { return Tlock + 1 }
func (m *LockReply) Encode(e *Enc) { e.U8(m.Status) }
func (m *LockReply) Decode(d *Dec) { m.Status = d.U8() }

// Getlock asks whether a lock could be taken (Tgetlock); the reply
// (Rgetlock) has the same fields: the conflicting lock, or LockUnlock.
type Getlock struct {
	R             bool // the reply
	Fid           uint32
	LockType      uint8
	Start, Length uint64
	ProcID        uint32
	ClientID      string
}

func (m *Getlock) Type() uint8 {
	if m.R {
		return Tgetlock + 1
	}
	return Tgetlock
}
func (m *Getlock) Encode(e *Enc) {
	if !m.R {
		e.U32(m.Fid)
	}
	e.U8(m.LockType)
	e.U64(m.Start)
	e.U64(m.Length)
	e.U32(m.ProcID)
	e.Str(m.ClientID)
}
func (m *Getlock) Decode(d *Dec) {
	if !m.R {
		m.Fid = d.U32()
	}
	m.LockType, m.Start, m.Length = d.U8(), d.U64(), d.U64()
	m.ProcID, m.ClientID = d.U32(), d.Str()
}

// Xattrwalk makes NewFid the value of Fid's extended attribute Name
// (their list for ""); XattrwalkReply has its size.
type Xattrwalk struct {
	Fid, NewFid uint32
	Name        string
}

func (*Xattrwalk) Type() uint8     { return Txattrwalk }
func (m *Xattrwalk) Encode(e *Enc) { e.U32(m.Fid); e.U32(m.NewFid); e.Str(m.Name) }
func (m *Xattrwalk) Decode(d *Dec) { m.Fid, m.NewFid, m.Name = d.U32(), d.U32(), d.Str() }

type XattrwalkReply struct{ Size uint64 }

func (*XattrwalkReply) Type() uint8     { return Txattrwalk + 1 }
func (m *XattrwalkReply) Encode(e *Enc) { e.U64(m.Size) }
func (m *XattrwalkReply) Decode(d *Dec) { m.Size = d.U64() }

// Xattrcreate turns Fid into the value of the attribute Name, written
// with Twrite and set at the clunk (size 0: removed); NoReply answers.
type Xattrcreate struct {
	Fid   uint32
	Name  string
	Size  uint64
	Flags uint32
}

func (*Xattrcreate) Type() uint8 { return Txattrcreate }
func (m *Xattrcreate) Encode(e *Enc) {
	e.U32(m.Fid)
	e.Str(m.Name)
	e.U64(m.Size)
	e.U32(m.Flags)
}
func (m *Xattrcreate) Decode(d *Dec) {
	m.Fid, m.Name, m.Size, m.Flags = d.U32(), d.Str(), d.U64(), d.U32()
}

// StatfsReply is a file system's statistics.
type StatfsReply struct {
	FsType, Bsize                             uint32
	Blocks, Bfree, Bavail, Files, Ffree, Fsid uint64
	Namelen                                   uint32
}

func (*StatfsReply) Type() uint8 { return Tstatfs + 1 }
func (m *StatfsReply) Encode(e *Enc) {
	e.U32(m.FsType)
	e.U32(m.Bsize)
	for _, v := range []uint64{m.Blocks, m.Bfree, m.Bavail, m.Files, m.Ffree, m.Fsid} {
		e.U64(v)
	}
	e.U32(m.Namelen)
}
func (m *StatfsReply) Decode(d *Dec) {
	m.FsType, m.Bsize = d.U32(), d.U32()
	m.Blocks, m.Bfree, m.Bavail = d.U64(), d.U64(), d.U64()
	m.Files, m.Ffree, m.Fsid = d.U64(), d.U64(), d.U64()
	m.Namelen = d.U32()
}

// ErrorReply is a request's failure: a Linux errno.
type ErrorReply struct{ Ecode uint32 }

func (*ErrorReply) Type() uint8     { return Rlerror }
func (m *ErrorReply) Encode(e *Enc) { e.U32(m.Ecode) }
func (m *ErrorReply) Decode(d *Dec) { m.Ecode = d.U32() }
