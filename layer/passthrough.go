package layer

import "context"

// PassThrough passes a node's operations to the node beneath it. A layer
// embeds it and writes only the operations it changes, like go-fuse's
// LoopbackNode. Operations that return or take nodes (Lookup, Mkdir,
// Mknod, Symlink, Create, Link, Rename) are left out: a layer must give
// its own nodes above, never the lower ones, so the compiler asks for
// them (var _ layer.Node = (*node)(nil)).
type PassThrough struct {
	Lower Node
}

func (p *PassThrough) Token() Token { return p.Lower.Token() }

func (p *PassThrough) Getattr(ctx context.Context, h Handle, out *Attr) Errno {
	return p.Lower.Getattr(ctx, h, out)
}

func (p *PassThrough) Setattr(ctx context.Context, h Handle, in *SetAttr, out *Attr) Errno {
	return p.Lower.Setattr(ctx, h, in, out)
}

func (p *PassThrough) Unlink(ctx context.Context, name string) Errno {
	return p.Lower.Unlink(ctx, name)
}

func (p *PassThrough) Rmdir(ctx context.Context, name string) Errno { return p.Lower.Rmdir(ctx, name) }

func (p *PassThrough) Readlink(ctx context.Context) ([]byte, Errno) { return p.Lower.Readlink(ctx) }

func (p *PassThrough) Open(ctx context.Context, flags uint32) (Handle, Errno) {
	return p.Lower.Open(ctx, flags)
}

func (p *PassThrough) OpenDir(ctx context.Context) (DirStream, Errno) { return p.Lower.OpenDir(ctx) }

// SeeksAnywhere: the streams are the lower node's, offsets and all.
func (p *PassThrough) SeeksAnywhere() bool {
	s, ok := p.Lower.(DirSeeker)
	return ok && s.SeeksAnywhere()
}

func (p *PassThrough) Statfs(ctx context.Context, out *Statfs) Errno { return p.Lower.Statfs(ctx, out) }

func (p *PassThrough) Getxattr(ctx context.Context, name string, dest []byte) (int, Errno) {
	return p.Lower.Getxattr(ctx, name, dest)
}

func (p *PassThrough) Setxattr(ctx context.Context, name string, value []byte, flags uint32) Errno {
	return p.Lower.Setxattr(ctx, name, value, flags)
}

func (p *PassThrough) Listxattr(ctx context.Context, dest []byte) (int, Errno) {
	return p.Lower.Listxattr(ctx, dest)
}

func (p *PassThrough) Removexattr(ctx context.Context, name string) Errno {
	return p.Lower.Removexattr(ctx, name)
}

// Forget forgets the lower node: this node was its only holder.
func (p *PassThrough) Forget() { p.Lower.Forget() }
