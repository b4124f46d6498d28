package volume

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// Rename is one transaction whatever it moves: both entries, both
// directories' counts and link counts, the moved directory's parent and
// the replaced inode's removal commit together or not at all.
func (n *node) Rename(ctx context.Context, name string, newDir layer.Node, newName string, flags uint32) layer.Errno {
	if e := unchecked(ctx); e != 0 {
		return e
	}
	d, ok := asNode(newDir)
	if !ok || d.fs != n.fs {
		return syscall.EXDEV
	}
	if e := validName(name); e != 0 {
		return e
	}
	if e := validName(newName); e != 0 {
		return e
	}
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 ||
		flags&unix.RENAME_NOREPLACE != 0 && flags&unix.RENAME_EXCHANGE != 0 {
		return syscall.EINVAL
	}
	var moved, replaced uint64
	e := n.fs.update(ctx, "rename", func(t *ntx) error {
		moved, replaced = 0, 0
		ents, err := t.dirents([]uint64{n.ino, d.ino}, n.ino, name, d.ino, newName)
		if err != nil {
			return err
		}
		if _, err := t.dir(n.ino); err != nil {
			return err
		}
		if _, err := t.dir(d.ino); err != nil {
			return err
		}
		src, dst := ents[0], ents[1]
		if src == nil {
			return syscall.ENOENT
		}
		moved = src.Ino
		if dst != nil {
			replaced = dst.Ino
		}
		if err := t.load(moved, replaced); err != nil {
			return err
		}
		if flags&unix.RENAME_EXCHANGE != 0 {
			if dst == nil {
				return syscall.ENOENT
			}
			return t.exchange(n.ino, name, src, d.ino, newName, dst)
		}
		if dst != nil && flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		return t.move(n.ino, name, src, d.ino, newName, dst)
	})
	if e != 0 {
		return e
	}
	n.fs.raise(ctx, layer.Entries, n.ino, name)
	n.fs.raise(ctx, layer.Entries, d.ino, newName)
	n.fs.raise(ctx, layer.Attrs, moved, "")
	if replaced != 0 {
		n.fs.raise(ctx, layer.Attrs, replaced, "")
	}
	return 0
}

// move is rename(2) without flags, or with RENAME_NOREPLACE.
func (t *ntx) move(sdir uint64, sname string, src *Dirent, ddir uint64, dname string, dst *Dirent) error {
	min, err := t.inode(src.Ino)
	if err != nil {
		return err
	}
	if min.isDir() && sdir != ddir {
		if err := t.notBeneath(ddir, src.Ino); err != nil {
			return err
		}
	}
	if dst != nil {
		if dst.Ino == src.Ino {
			return nil // two links of one file: nothing to do
		}
		din, err := t.inode(dst.Ino)
		if err != nil {
			return err
		}
		switch {
		case min.isDir() && !din.isDir():
			return syscall.ENOTDIR
		case !min.isDir() && din.isDir():
			return syscall.EISDIR
		case din.isDir() && din.Entries > 0:
			return syscall.ENOTEMPTY
		}
		if din.isDir() {
			t.inodes[ddir].Nlink--
		}
		t.unlinkInode(dst.Ino)
		t.putEntry(ddir, dname, src.Ino, src.Type)
		t.touch(ddir, 'm')
	} else {
		t.addEntry(ddir, dname, src.Ino, src.Type)
	}
	t.delEntry(sdir, sname)
	if min.isDir() && sdir != ddir {
		t.inodes[sdir].Nlink--
		t.inodes[ddir].Nlink++
		min.Parent = ddir
	}
	t.touch(src.Ino, 'c')
	return nil
}

// exchange is rename(2) with RENAME_EXCHANGE: the two names swap files.
func (t *ntx) exchange(sdir uint64, sname string, src *Dirent, ddir uint64, dname string, dst *Dirent) error {
	a, err := t.inode(src.Ino)
	if err != nil {
		return err
	}
	b, err := t.inode(dst.Ino)
	if err != nil {
		return err
	}
	if sdir != ddir {
		if a.isDir() {
			if err := t.notBeneath(ddir, src.Ino); err != nil {
				return err
			}
		}
		if b.isDir() {
			if err := t.notBeneath(sdir, dst.Ino); err != nil {
				return err
			}
		}
	}
	t.putEntry(sdir, sname, dst.Ino, dst.Type)
	t.putEntry(ddir, dname, src.Ino, src.Type)
	if sdir != ddir {
		if a.isDir() {
			a.Parent = ddir
			t.inodes[sdir].Nlink--
			t.inodes[ddir].Nlink++
		}
		if b.isDir() {
			b.Parent = sdir
			t.inodes[ddir].Nlink--
			t.inodes[sdir].Nlink++
		}
	}
	t.touch(sdir, 'm')
	t.touch(ddir, 'm')
	t.touch(src.Ino, 'c')
	t.touch(dst.Ino, 'c')
	return nil
}

// notBeneath refuses to move directory ino into dir when dir is ino or
// lies beneath it: the tree would lose a branch in a loop. The parents
// read are checked at commit, so a concurrent move cannot slip one in.
func (t *ntx) notBeneath(dir, ino uint64) error {
	for d := dir; ; {
		if d == ino {
			return syscall.EINVAL
		}
		if d == rootIno {
			return nil
		}
		in, err := t.inode(d)
		if err != nil {
			return err
		}
		d = in.Parent
	}
}
