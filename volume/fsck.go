package volume

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"syscall"
)

// Fsck checks the namespace of volume u, read at one revision: every
// entry names an inode that exists; a directory counts its entries,
// links 2 plus its subdirectories, and its parent has its entry; a file
// links as many entries as name it, or none while an o/ key keeps it.
// It returns what is wrong, one line each (none: whole). It changes
// nothing.
func Fsck(ctx context.Context, u URL) ([]string, error) {
	eng, err := DialEtcd(ctx, u.Etcd)
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	k := newKeys(u.Name)
	all, _, err := eng.List(ctx, k.p, 0)
	if err != nil {
		return nil, err
	}
	inodes := map[uint64]*Inode{}
	orphans := map[uint64]bool{}
	type ent struct {
		dir  uint64
		name string
		d    Dirent
	}
	var ents []ent
	var bad []string
	for _, kv := range all {
		kind, ino, name := k.parse(kv.Key)
		switch kind {
		case 'i':
			in, err := decodeInode(kv.Val)
			if err != nil {
				bad = append(bad, fmt.Sprintf("inode %d: %v", ino, err))
				continue
			}
			inodes[ino] = in
		case 'd':
			var d Dirent
			if err := json.Unmarshal(kv.Val, &d); err != nil {
				bad = append(bad, fmt.Sprintf("entry %q of %d: %v", name, ino, err))
				continue
			}
			ents = append(ents, ent{ino, name, d})
		case 'o':
			orphans[ino] = true
		}
	}
	if inodes[rootIno] == nil {
		return append(bad, "no root directory"), nil
	}
	links := map[uint64]int{}
	entries := map[uint64]int{}
	subdirs := map[uint64]int{}
	named := map[uint64][]uint64{} // directory -> the directories naming it
	for _, e := range ents {
		entries[e.dir]++
		if inodes[e.dir] == nil {
			bad = append(bad, fmt.Sprintf("entry %q is in directory %d, which does not exist", e.name, e.dir))
		}
		in := inodes[e.d.Ino]
		if in == nil {
			bad = append(bad, fmt.Sprintf("entry %q of directory %d names inode %d, which does not exist", e.name, e.dir, e.d.Ino))
			continue
		}
		if in.Mode&syscall.S_IFMT != e.d.Type {
			bad = append(bad, fmt.Sprintf("entry %q of directory %d says type %o, inode %d is %o", e.name, e.dir, e.d.Type, e.d.Ino, in.Mode&syscall.S_IFMT))
		}
		links[e.d.Ino]++
		if in.isDir() {
			subdirs[e.dir]++
			named[e.d.Ino] = append(named[e.d.Ino], e.dir)
		}
	}
	inos := make([]uint64, 0, len(inodes))
	for ino := range inodes {
		inos = append(inos, ino)
	}
	sort.Slice(inos, func(i, j int) bool { return inos[i] < inos[j] })
	for _, ino := range inos {
		in := inodes[ino]
		if in.isDir() {
			if int(in.Entries) != entries[ino] {
				bad = append(bad, fmt.Sprintf("directory %d counts %d entries, has %d", ino, in.Entries, entries[ino]))
			}
			if want := 2 + subdirs[ino]; int(in.Nlink) != want {
				bad = append(bad, fmt.Sprintf("directory %d has %d links, want %d (2 and its subdirectories)", ino, in.Nlink, want))
			}
			if ino == rootIno {
				continue
			}
			if len(named[ino]) != 1 || named[ino][0] != in.Parent {
				bad = append(bad, fmt.Sprintf("directory %d has parent %d but is named in %v", ino, in.Parent, named[ino]))
			}
			continue
		}
		switch {
		case links[ino] == 0 && in.Nlink == 0 && orphans[ino]:
			// open somewhere, removed at its last close
		case links[ino] == 0 && in.Nlink == 0:
			bad = append(bad, fmt.Sprintf("inode %d has no links and no client holds it open (gc removes it)", ino))
		case int(in.Nlink) != links[ino]:
			bad = append(bad, fmt.Sprintf("inode %d has %d links, %d entries name it", ino, in.Nlink, links[ino]))
		}
	}
	return bad, nil
}

// FsckReport is Fsck's findings as text.
func FsckReport(bad []string) string { return strings.Join(bad, "\n") }
