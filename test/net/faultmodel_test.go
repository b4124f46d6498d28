package net

// The fault harness's model: the operations a workload reports, and the
// states of its files they allow.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func (o *faultOp) String() string {
	s := fmt.Sprintf("#%d %s %s", o.seq, o.kind, o.a)
	switch o.kind {
	case "rename", "link":
		s += " " + o.b
	case "write":
		s += fmt.Sprintf(" (%dB", o.size)
		if o.sync {
			s += ", fsync"
		}
		s += ")"
	case "append":
		s += fmt.Sprintf(" (%dB)", o.size)
	}
	return s
}

// parseFaultOp reads a do line's fields after MONO and "do".
func parseFaultOp(mono int64, f []string) (*faultOp, error) {
	if len(f) < 3 {
		return nil, fmt.Errorf("short do line %q", f)
	}
	seq, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return nil, err
	}
	o := &faultOp{seq: seq, kind: f[1], a: f[2], do: mono}
	switch o.kind {
	case "write":
		if len(f) != 5 {
			return nil, fmt.Errorf("bad write line %q", f)
		}
		o.size, _ = strconv.Atoi(f[3])
		o.sync = f[4] == "1"
	case "append":
		if len(f) != 4 {
			return nil, fmt.Errorf("bad append line %q", f)
		}
		o.size, _ = strconv.Atoi(f[3])
	case "rename", "link":
		if len(f) != 4 {
			return nil, fmt.Errorf("bad %s line %q", o.kind, f)
		}
		o.b = f[3]
	case "fsync", "unlink", "read", "peek":
	default:
		return nil, fmt.Errorf("unknown operation %q", o.kind)
	}
	return o, nil
}

func (i *faultInode) add(cs ...string) {
	for _, c := range cs {
		if !slices.Contains(i.cur, c) {
			i.cur = append(i.cur, c)
		}
		i.since[c] = true
	}
}

func newFaultModel(inst string) *faultModel {
	return &faultModel{inst: inst, names: map[string]*faultInode{}, wild: map[string]int{}}
}

func (m *faultModel) isWild(name string) bool {
	_, ok := m.wild[name]
	return ok
}

// wildify makes names unknown, in one group with every name that may
// share a file with one of them: its links, its group.
func (m *faultModel) wildify(names ...string) {
	m.groups++
	all := map[string]bool{}
	for _, name := range names {
		all[name] = true
		if ino := m.names[name]; ino != nil {
			for n, i := range m.names {
				if i == ino {
					all[n] = true
				}
			}
		}
		if g, ok := m.wild[name]; ok {
			for n, h := range m.wild {
				if h == g {
					all[n] = true
				}
			}
		}
	}
	for n := range all {
		delete(m.names, n)
		m.wild[n] = m.groups
	}
}

// alone tells whether the wild name shares its group with no other.
func (m *faultModel) alone(name string) bool {
	g := m.wild[name]
	for n, h := range m.wild {
		if h == g && n != name {
			return false
		}
	}
	return true
}

// apply applies o to the model: ok tells whether it succeeded.
func (m *faultModel) apply(o *faultOp, ok bool) {
	ino := m.names[o.a]
	switch o.kind {
	case "write":
		c := string(faultChunk(m.inst, o.seq, o.size))
		switch {
		case ok && ino == nil && m.isWild(o.a) && !m.alone(o.a):
			// Its file may be another wild name's: still unknown.
		case ok:
			if ino == nil {
				// Made now (the name reaches the server at once), or a
				// wild name that shares no file: a file of its own.
				m.made++
				ino = &faultInode{id: m.made, since: map[string]bool{"": true}}
				delete(m.wild, o.a)
				m.names[o.a] = ino
			}
			ino.since[""] = true // O_TRUNC
			ino.since[c] = true
			ino.cur = []string{c}
			if o.sync {
				ino.since = map[string]bool{c: true}
			}
		case ino != nil:
			ino.add("", c)
		default:
			m.wildify(o.a)
		}
	case "append":
		if ino == nil {
			if ok && !m.isWild(o.a) {
				m.anomalies = append(m.anomalies, fmt.Sprintf("%s succeeded on a name the model has not", o))
				m.wildify(o.a)
			}
			return
		}
		c := string(faultChunk(m.inst, o.seq, o.size))
		var next []string
		for _, s := range ino.cur {
			next = append(next, s+c)
		}
		if ok {
			ino.cur = nil
		}
		ino.add(next...)
	case "fsync":
		if ok && ino != nil {
			ino.since = map[string]bool{}
			for _, c := range ino.cur {
				ino.since[c] = true
			}
		}
	case "rename":
		switch {
		case !ok:
			m.wildify(o.a, o.b)
		case m.isWild(o.a):
			g := m.wild[o.a]
			if h, ok := m.wild[o.b]; !ok || h != g {
				delete(m.wild, o.a) // gone, whatever it was
			} // else both may name one file: then rename does nothing, and a stays
			delete(m.names, o.b)
			m.wild[o.b] = g
		case ino == nil:
			m.anomalies = append(m.anomalies, fmt.Sprintf("%s succeeded on a name the model has not", o))
			m.wildify(o.b)
		case m.names[o.b] == ino:
			// Two links of one file: rename does nothing.
		default:
			delete(m.names, o.a)
			delete(m.wild, o.b)
			m.names[o.b] = ino
		}
	case "unlink":
		switch {
		case ok:
			if ino == nil && !m.isWild(o.a) {
				m.anomalies = append(m.anomalies, fmt.Sprintf("%s succeeded on a name the model has not", o))
			}
			delete(m.names, o.a)
			delete(m.wild, o.a)
		default:
			m.wildify(o.a)
		}
	case "link":
		switch {
		case !ok:
			m.wildify(o.a, o.b)
		case m.isWild(o.a):
			delete(m.names, o.b)
			m.wild[o.b] = m.wild[o.a]
		case ino == nil:
			m.anomalies = append(m.anomalies, fmt.Sprintf("%s succeeded on a name the model has not", o))
			m.wildify(o.b)
		default:
			delete(m.wild, o.b)
			m.names[o.b] = ino
		}
	}
	if ino != nil && len(ino.cur) > faultMaxSets {
		m.wildify(o.a)
	}
}

// check tells how what name holds (b; exists false: no such name)
// differs from the model: "" if it is one of the contents the model
// allows (the current ones; with killed, any since the last fsync).
func (m *faultModel) check(name string, b []byte, exists, killed bool) string {
	if m.isWild(name) {
		return ""
	}
	ino := m.names[name]
	switch {
	case ino == nil && !exists:
		return ""
	case ino == nil:
		return fmt.Sprintf("%s exists (%s), the model has no such name", name, faultDescribe(b))
	case !exists:
		return fmt.Sprintf("%s is missing; want %s", name, m.want(ino, killed))
	}
	if slices.Contains(ino.cur, string(b)) || killed && ino.since[string(b)] {
		return ""
	}
	return fmt.Sprintf("%s has %s (%d bytes); want %s", name, faultDescribe(b), len(b), m.want(ino, killed))
}

func (m *faultModel) want(ino *faultInode, killed bool) string {
	set := ino.cur
	if killed {
		set = nil
		for c := range ino.since {
			set = append(set, c)
		}
		slices.Sort(set)
	}
	var ds []string
	for _, c := range set {
		ds = append(ds, faultDescribe([]byte(c)))
	}
	if len(ds) == 1 {
		return ds[0]
	}
	return "one of {" + strings.Join(ds, ", ") + "}"
}

// links is name and the other names of its file, sorted.
func (m *faultModel) links(name string) []string {
	ns := []string{name}
	if ino := m.names[name]; ino != nil {
		for n, i := range m.names {
			if i == ino && n != name {
				ns = append(ns, n)
			}
		}
	}
	slices.Sort(ns)
	return ns
}

// files is the ids of the files names a and b are now (0 for none).
func (m *faultModel) files(o *faultOp) []int {
	var ids []int
	for _, n := range []string{o.a, o.b} {
		if ino := m.names[n]; ino != nil && !slices.Contains(ids, ino.id) {
			ids = append(ids, ino.id)
		}
	}
	return ids
}

// present is the names that may exist, sorted.
func (m *faultModel) present() []string {
	var ns []string
	for n := range m.names {
		ns = append(ns, n)
	}
	for n := range m.wild {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}

// TestFaultModel checks the harness's own pieces, without a mount: chunks
// are recognised whole, cut short and padded with zeros, and the model
// follows links, renames, fsyncs and failed operations.
func TestFaultModel(t *testing.T) {
	c := faultChunk("c1.0", 7, 100)
	if got := faultDescribe(append(append([]byte{}, c...), faultChunk("c1.0", 9, 60)...)); got != "c1.0#7(100B)+c1.0#9(60B)" {
		t.Errorf("describe: %s", got)
	}
	if got := faultDescribe(append(c[:40:40], 0, 0, 0)); got != "c1.0#7(100B)[:40]+zeros(3)" {
		t.Errorf("describe of a prefix and zeros: %s", got)
	}
	for b, want := range map[string]string{string(c): "v 7", string(c[:50]): "part 7", string(c) + "\x00\x00": "v 7",
		"": "empty 0", "\x00\x00": "zeros 0", "hello": "junk 0", "<c1.0 #7": "part -1"} {
		if got := faultClass([]byte(b)); got != want {
			t.Errorf("class of %q: %s, want %s", b, got, want)
		}
	}

	m := newFaultModel("c1.0")
	do := func(ok bool, seq int64, kind, a, b string) {
		m.apply(&faultOp{seq: seq, kind: kind, a: a, b: b, size: 100}, ok)
	}
	is := func(name, content string, killed bool) {
		t.Helper()
		if msg := m.check(name, []byte(content), content != "-", killed); msg != "" {
			t.Error(msg)
		}
	}
	isNot := func(name, content string, killed bool) {
		t.Helper()
		if msg := m.check(name, []byte(content), content != "-", killed); msg == "" {
			t.Errorf("%s may hold %q: the model allows it", name, faultDescribe([]byte(content)))
		}
	}
	ch := func(n int64) string { return string(faultChunk("c1.0", n, 100)) }
	do(true, 1, "write", "a", "")
	do(true, 2, "append", "a", "")
	do(true, 3, "link", "a", "b")
	do(true, 4, "fsync", "b", "")
	do(true, 5, "append", "b", "")
	is("a", ch(1)+ch(2)+ch(5), false)
	isNot("a", ch(1)+ch(2), false)
	is("a", ch(1)+ch(2), true) // fsynced: what a killed client leaves
	isNot("a", ch(1), true)
	do(true, 6, "rename", "a", "c")
	is("a", "-", false)
	is("c", ch(1)+ch(2)+ch(5), false)
	do(true, 7, "unlink", "b", "")
	do(false, 8, "append", "c", "") // failed: either
	is("c", ch(1)+ch(2)+ch(5), false)
	is("c", ch(1)+ch(2)+ch(5)+ch(8), false)
	do(false, 9, "rename", "c", "d") // failed: both unknown
	is("c", "-", false)
	is("d", "anything", false)
	do(true, 10, "write", "d", "") // d may be c's file: still unknown
	is("d", "anything", false)
	do(true, 11, "unlink", "c", "")
	do(true, 12, "write", "d", "") // now d is alone
	is("d", ch(12), false)
	isNot("d", ch(10), false)
	if len(m.anomalies) > 0 {
		t.Errorf("anomalies: %v", m.anomalies)
	}
}

// TestFaultModelWildRename: a rename of a wild name onto another of its
// group may be a rename of a file onto itself, which leaves both names
// (what soak2's c2.0 met: f19 renamed onto f01, one file, then written
// and linked as if new, read back the group's bytes).
func TestFaultModelWildRename(t *testing.T) {
	m := newFaultModel("c1.0")
	do := func(ok bool, seq int64, kind, a, b string) {
		m.apply(&faultOp{seq: seq, kind: kind, a: a, b: b, size: 100}, ok)
	}
	ch := func(n int64) string { return string(faultChunk("c1.0", n, 100)) }
	do(true, 1, "write", "a", "")
	do(true, 2, "link", "a", "b")
	do(false, 3, "rename", "b", "c") // failed (a fault): a, b, c unknown, maybe one file
	do(true, 4, "rename", "b", "c")  // b and c were one file: b is still there
	do(true, 5, "write", "b", "")    // the group's file
	do(true, 6, "link", "b", "d")
	do(true, 7, "append", "a", "")
	// What a POSIX file system holds if step 3 made c b's file: all four
	// names are one file.
	for _, name := range []string{"a", "b", "c", "d"} {
		if msg := m.check(name, []byte(ch(5)+ch(7)), true, false); msg != "" {
			t.Error(msg)
		}
	}
	if len(m.anomalies) > 0 {
		t.Errorf("anomalies: %v", m.anomalies)
	}
}
