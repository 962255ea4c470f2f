//go:build linux

// Package btrfs holds the few btrfs operations controld's disk quotas need,
// through ioctls and sysfs (no btrfs-progs at run time): subvolumes, the
// quota group limit of a subvolume, and its usage. A subvolume with a
// limit on its quota group is a directory tree the kernel refuses to let
// grow past the limit (EDQUOT), whoever writes, root included.
package btrfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctls of linux/btrfs.h (magic 0x94).
const (
	iocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocInoLookup    = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	iocFSInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	iocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	superMagic          = 0x9123683e // BTRFS_SUPER_MAGIC
	firstFreeObjectID   = 256        // BTRFS_FIRST_FREE_OBJECTID: a subvolume's root inode
	qgroupLimitMaxRfer  = 1          // BTRFS_QGROUP_LIMIT_MAX_RFER
	pathNameMax         = 4087       // BTRFS_PATH_NAME_MAX
	inoLookupPathMax    = 4080       // BTRFS_INO_LOOKUP_PATH_MAX
	fsInfoReservedBytes = 944
)

type volArgs struct {
	fd   int64
	name [pathNameMax + 1]byte
}

type inoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [inoLookupPathMax]byte
}

type fsInfoArgs struct {
	maxID          uint64
	numDevices     uint64
	fsid           [16]byte
	nodesize       uint32
	sectorsize     uint32
	cloneAlignment uint32
	csumType       uint16
	csumSize       uint16
	flags          uint64
	generation     uint64
	metadataUUID   [16]byte
	reserved       [fsInfoReservedBytes]byte
}

type qgroupLimit struct {
	flags   uint64
	maxRfer uint64
	maxExcl uint64
	rsvRfer uint64
	rsvExcl uint64
}

type qgroupLimitArgs struct {
	qgroupID uint64
	lim      qgroupLimit
}

func init() {
	// The structs must match the kernel's byte for byte.
	if unsafe.Sizeof(volArgs{}) != 4096 || unsafe.Sizeof(inoLookupArgs{}) != 4096 ||
		unsafe.Sizeof(fsInfoArgs{}) != 1024 || unsafe.Sizeof(qgroupLimitArgs{}) != 48 {
		panic("btrfs: ioctl struct sizes do not match linux/btrfs.h")
	}
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func volName(name string) (volArgs, error) {
	var a volArgs
	if name == "" || len(name) > pathNameMax || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return a, fmt.Errorf("btrfs: bad subvolume name %q", name)
	}
	copy(a.name[:], name)
	return a, nil
}

// IsBtrfs reports whether path lies on a btrfs filesystem.
func IsBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return uint32(st.Type) == superMagic, nil
}

// CreateSubvolume creates the subvolume parent/name.
func CreateSubvolume(parent, name string) error {
	a, err := volName(name)
	if err != nil {
		return err
	}
	fd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := ioctl(fd, iocSubvolCreate, unsafe.Pointer(&a)); err != nil {
		return &os.PathError{Op: "btrfs subvolume create", Path: filepath.Join(parent, name), Err: err}
	}
	return nil
}

// DeleteSubvolume deletes the subvolume parent/name with everything in it
// (the kernel frees its blocks in the background). A name that does not
// exist is fs.ErrNotExist.
func DeleteSubvolume(parent, name string) error {
	a, err := volName(name)
	if err != nil {
		return err
	}
	fd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := ioctl(fd, iocSnapDestroy, unsafe.Pointer(&a)); err != nil {
		return &os.PathError{Op: "btrfs subvolume delete", Path: filepath.Join(parent, name), Err: err}
	}
	return nil
}

// IsSubvolume reports whether path is the root of a btrfs subvolume.
func IsSubvolume(path string) bool {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Ino != firstFreeObjectID {
		return false
	}
	ok, err := IsBtrfs(path)
	return err == nil && ok
}

// SetLimit limits the space the subvolume at path references (its quota
// group's max_rfer): data and metadata, in bytes. Quotas must be enabled on
// the filesystem.
func SetLimit(path string, maxBytes uint64) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// qgroupid 0: the subvolume fd names.
	a := qgroupLimitArgs{lim: qgroupLimit{flags: qgroupLimitMaxRfer, maxRfer: maxBytes}}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return &os.PathError{Op: "btrfs qgroup limit", Path: path, Err: err}
	}
	return nil
}

// Usage is a subvolume's quota group as the kernel accounts it.
type Usage struct {
	// Referenced is the bytes the subvolume references as of the last
	// transaction commit (btrfs commits every 30 s by default); Reserved
	// the bytes writes since then reserved against the limit. Their sum is
	// what the limit is checked against.
	Referenced, Reserved uint64
	Limit                uint64 // max_rfer; 0 when none
}

// Used is Referenced and Reserved together.
func (u Usage) Used() uint64 { return u.Referenced + u.Reserved }

// SubvolumeUsage reads the quota group of the subvolume at path from sysfs.
func SubvolumeUsage(path string) (Usage, error) {
	dir, err := qgroupDir(path)
	if err != nil {
		return Usage{}, err
	}
	ref, err := readUint(filepath.Join(dir, "referenced"))
	if err != nil {
		return Usage{}, err
	}
	lim, err := readUint(filepath.Join(dir, "max_referenced"))
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Referenced: ref, Limit: lim}
	for _, f := range []string{"rsv_data", "rsv_meta_pertrans", "rsv_meta_prealloc"} {
		v, err := readUint(filepath.Join(dir, f))
		if err != nil {
			return Usage{}, err
		}
		u.Reserved += v
	}
	return u, nil
}

// QuotaEnabled reports whether quota groups are enabled on the btrfs
// filesystem at path (sysfs shows them only then).
func QuotaEnabled(path string) (bool, error) {
	fsid, err := fsID(path)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join("/sys/fs/btrfs", fsid, "qgroups"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func qgroupDir(path string) (string, error) {
	fsid, err := fsID(path)
	if err != nil {
		return "", err
	}
	id, err := subvolumeID(path)
	if err != nil {
		return "", err
	}
	return filepath.Join("/sys/fs/btrfs", fsid, "qgroups", "0_"+strconv.FormatUint(id, 10)), nil
}

func fsID(path string) (string, error) {
	fd, err := openDir(path)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var a fsInfoArgs
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&a)); err != nil {
		return "", &os.PathError{Op: "btrfs fs info", Path: path, Err: err}
	}
	u := a.fsid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// subvolumeID returns the id of the subvolume path lies in.
func subvolumeID(path string) (uint64, error) {
	fd, err := openDir(path)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	a := inoLookupArgs{objectID: firstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, &os.PathError{Op: "btrfs inode lookup", Path: path, Err: err}
	}
	return a.treeID, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
