package peer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// KubeletDir is where the device manager listens: pluginapi.KubeletSocket's directory,
// fixed in NewManagerImpl.
const KubeletDir = "/var/lib/kubelet/device-plugins"

// EnterKubeletDir makes source appear at KubeletDir for this process only.
//
// The process must already be in a mount namespace of its own (unshare -m execs it);
// it refuses otherwise, so a real kubelet directory is never mounted over on the
// machine. Mounts are made private first so none propagates back.
func EnterKubeletDir(source string) error {
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("cannot read this process's mount namespace: %w", err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return fmt.Errorf("cannot read the parent's mount namespace: %w", err)
	}
	if own == parent {
		return errors.New("refusing to mount: this process shares its parent's mount namespace (start it with unshare -m)")
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("cannot make mounts private: %w", err)
	}
	if _, err := os.Stat(KubeletDir); errors.Is(err, fs.ErrNotExist) {
		// Nothing to bind over: cover the deepest existing ancestor with an empty
		// tmpfs (seen by this process only) and create the path inside it.
		ancestor := filepath.Dir(KubeletDir)
		for {
			if _, err := os.Stat(ancestor); err == nil {
				break
			}
			ancestor = filepath.Dir(ancestor)
		}
		if ancestor == "/" {
			return errors.New("refusing to cover / with a tmpfs: the machine has no /var")
		}
		if err := syscall.Mount("tmpfs", ancestor, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("cannot mount a tmpfs on %s: %w", ancestor, err)
		}
		if err := os.MkdirAll(KubeletDir, 0o750); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if err := syscall.Mount(source, KubeletDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("cannot bind %s on %s: %w", source, KubeletDir, err)
	}
	return nil
}
