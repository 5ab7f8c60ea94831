// slowfs mounts a directory again through FUSE, with every read of a file's data held
// for a delay the test sets while the mount is in use: a disk that is slow, as a volume
// freshly attached over the network can be, for the e2e on the real node.
//
//	slowfs -backing DIR -mount DIR -control FILE
//
// FILE holds the delay in milliseconds (read again at each read; missing or empty is 0).
// The mount lets every user in (allow_other: a pod's user reads its volume through it)
// and is unmounted on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

var control string

// delay is what the control file says now.
func delay() time.Duration {
	b, err := os.ReadFile(control)
	if err != nil {
		return 0
	}
	ms, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || ms < 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// node is a loopback node whose opened files read slowly. The files are opened for direct
// I/O: no read is served from the page cache, so each one reaches the delay.
type node struct{ fs.LoopbackNode }

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &file{fh.(*fs.LoopbackFile)}, fl | fuse.FOPEN_DIRECT_IO, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, &file{fh.(*fs.LoopbackFile)}, fl | fuse.FOPEN_DIRECT_IO, 0
}

type file struct{ *fs.LoopbackFile }

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if d := delay(); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done(): // the reader was interrupted (a signal, its exit)
			return nil, syscall.EINTR
		}
	}
	return f.LoopbackFile.Read(ctx, buf, off)
}

func main() {
	backing := flag.String("backing", "", "the directory to serve")
	mount := flag.String("mount", "", "where to mount it")
	flag.StringVar(&control, "control", "", "the file holding the read delay in ms")
	flag.Parse()
	if *backing == "" || *mount == "" || control == "" {
		log.Fatal("slowfs: -backing, -mount and -control are required")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(*backing, &st); err != nil {
		log.Fatalf("slowfs: %v", err)
	}
	root := &fs.LoopbackRoot{Path: *backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{fs.LoopbackNode{RootData: r}}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	server, err := fs.Mount(*mount, root.RootNode, &fs.Options{
		MountOptions: fuse.MountOptions{AllowOther: true, FsName: "slowfs", Name: "slowfs", DirectMountStrict: true},
	})
	if err != nil {
		log.Fatalf("slowfs: mount %s: %v", *mount, err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = server.Unmount()
	}()
	log.Printf("slowfs: %s on %s (read delay from %s)", *backing, *mount, control)
	server.Wait()
}
