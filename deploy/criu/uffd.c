/*
 * forkfleet-criu-uffd: preloaded into forkfleet's private CRIU by
 * deploy/host-setup.sh, with rlimits.c and ksm.c in the same library.
 *
 * A lazy restore (controld's page server, controld/internal/lazypages) needs
 * a userfaultfd in every restored task, and CRIU makes it there with
 * syscall(SYS_userfaultfd) (criu/uffd.c uffd_open), inside the sandbox's
 * user namespace: the kernel refuses that (EPERM) unless
 * vm.unprivileged_userfaultfd=1, a host-wide setting that hands every
 * unprivileged process on the host kernel-mode userfaultfds. The kernel has
 * a second way in that needs no such setting: /dev/userfaultfd's
 * USERFAULTFD_IOC_NEW makes the same uffd for the caller's memory, checked
 * only by the device file's mode when it is opened (root's, 0600).
 *
 * So, only in a lazy restore (CRIU connecting to lazy-pages.socket, in its
 * own process, as root in the host's namespaces, before it forks the tasks):
 * open /dev/userfaultfd, high in the fd table, close-on-exec. The restored
 * tasks inherit it. CRIU's close_old_fds closes every inherited fd in them
 * first thing; this one close is skipped, so the task still has it when
 * CRIU asks for its uffd, and a refused userfaultfd(2) is answered with the
 * ioctl, after which the task closes the device for good. A restored task
 * never runs with it: every task of a lazy restore makes its uffd before
 * its restorer starts (CRIU's helpers and zombies, which do not, exit
 * before the restored tasks run). The fd is checked to still be the device
 * before the ioctl (a restored file that took its number would fail the
 * restore, not be used). An eager restore and a dump never open it.
 *
 * Overcommit: a lazy restore reads no page in the restorer (CRIU's page
 * reader is not "pieok" with --lazy-pages, criu/pagemap.c), so CRIU premaps
 * every private mapping of every task in its own process, writable
 * (criu/mem.c premap_private_vma: prot | PROT_WRITE), where an eager restore
 * maps most of them in place with their own protection. A PROT_NONE
 * reservation (Chromium reserves up to a terabyte of address space for V8's
 * cages) is then a writable private mapping larger than the host's memory,
 * which the heuristic overcommit (vm.overcommit_memory=0) refuses: ENOMEM,
 * "Unable to map ANON_VMA", and the restore fails. Only in a lazy restore,
 * such a refused fixed private anonymous writable mapping is made again with
 * MAP_NORESERVE: the kernel does not charge it (as it did not charge the
 * PROT_NONE original), the restorer moves it into place and gives it back
 * its protection. Nothing else changes: under strict accounting (2) the
 * kernel ignores MAP_NORESERVE and the restore fails as before; any other
 * mapping, and every mapping of an eager restore or a dump, is CRIU's own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

/* Above the fds of any task forkfleet restores and the service fds CRIU
 * puts just above a task's highest fd. */
#define DEVFD_MIN 4096

static const char sock_name[] = "lazy-pages.socket";

static int lazy_restore; /* CRIU connected to lazy-pages.socket; its tasks inherit it */
static int devfd = -1;
static pid_t devfd_owner; /* CRIU's own process: its closes are real */
static dev_t devfd_rdev;
static ino_t devfd_ino;

static int real_close(int fd)
{
	static int (*real)(int);

	if (!real)
		real = (int (*)(int))dlsym(RTLD_NEXT, "close");
	return real(fd);
}

static int real_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real)(int, const struct sockaddr *, socklen_t);

	if (!real)
		real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
	return real(fd, addr, len);
}

/* Keeps fd, a device checked to be a character device, as devfd. */
static void keep_device(int fd)
{
	struct stat st;
	int high;

	high = fcntl(fd, F_DUPFD_CLOEXEC, DEVFD_MIN);
	real_close(fd);
	if (high < 0 || fstat(high, &st) || !S_ISCHR(st.st_mode)) {
		if (high >= 0)
			real_close(high);
		return;
	}
	devfd = high;
	devfd_owner = getpid();
	devfd_rdev = st.st_rdev;
	devfd_ino = st.st_ino;
}

/*
 * The device from the restore's owner: runc moves CRIU into the container's
 * cgroup before the restore, whose device rules refuse /dev/userfaultfd, so
 * controld (containerdrt, lazy.go) hands it over on userfaultfd.socket next
 * to lazy-pages.socket, in the restore's work dir (CRIU's cwd).
 */
static int device_from_owner(const char *sock_path, size_t dir_len)
{
	static const char name[] = "userfaultfd.socket";
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 2 };
	char byte, cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	int s, fd = -1;

	if (dir_len + sizeof(name) > sizeof(sun.sun_path))
		return -1;
	memcpy(sun.sun_path, sock_path, dir_len);
	memcpy(sun.sun_path + dir_len, name, sizeof(name));
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (real_connect(s, (struct sockaddr *)&sun, sizeof(sun)) == 0 && recvmsg(s, &msg, MSG_CMSG_CLOEXEC) == 1) {
		c = CMSG_FIRSTHDR(&msg);
		if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	}
	real_close(s);
	return fd;
}

static void open_device(const char *sock_path, size_t dir_len)
{
	int fd;

	if (devfd >= 0 || geteuid() != 0)
		return;
	fd = device_from_owner(sock_path, dir_len);
	if (fd < 0) /* a CRIU outside a device cgroup: open it itself */
		fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (fd >= 0)
		keep_device(fd); /* else the syscall's own answer stands */
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	const struct sockaddr_un *sun = (const struct sockaddr_un *)addr;
	size_t n = sizeof(sock_name) - 1, plen;
	int r;

	r = real_connect(fd, addr, len);
	if (r == 0 && addr && addr->sa_family == AF_UNIX && len > offsetof(struct sockaddr_un, sun_path)) {
		plen = strnlen(sun->sun_path, len - offsetof(struct sockaddr_un, sun_path));
		/* CRIU's restore connecting to its page server: a lazy restore. */
		if (plen >= n && !memcmp(sun->sun_path + plen - n, sock_name, n) &&
		    (plen == n || sun->sun_path[plen - n - 1] == '/')) {
			int saved = errno;
			lazy_restore = 1;
			open_device(sun->sun_path, plen - n);
			errno = saved;
		}
	}
	return r;
}

static void *real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static void *(*real)(void *, size_t, int, int, int, off_t);

	if (!real)
		real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
	return real(addr, len, prot, flags, fd, off);
}

/* A lazy restore's premap of a reservation: see the top of this file. */
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	const int premap = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
	void *p = real_mmap(addr, len, prot, flags, fd, off);

	if (p == MAP_FAILED && errno == ENOMEM && lazy_restore && (prot & PROT_WRITE) &&
	    (flags & (premap | MAP_SHARED | MAP_NORESERVE)) == premap)
		p = real_mmap(addr, len, prot, flags | MAP_NORESERVE, fd, off);
	return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

int close(int fd)
{
	/* close_old_fds in a restored task: keep the device until its uffd. */
	if (fd >= 0 && fd == devfd && getpid() != devfd_owner)
		return 0;
	if (fd >= 0 && fd == devfd)
		devfd = -1;
	return real_close(fd);
}

/*
 * forkfleet_uffd_syscall: called by syscall.c's syscall() after the real
 * call returned r (-1). Returns 1 when it answered a refused userfaultfd(2)
 * with the device (*out is the uffd or -1 with errno set), else 0.
 */
int forkfleet_uffd_syscall(long nr, const long *a, long r, long *out)
{
	struct stat st;
	int fd = devfd, uffd, err;

	if (nr != SYS_userfaultfd || r != -1 || errno != EPERM || fd < 0)
		return 0;
	if (fstat(fd, &st) || !S_ISCHR(st.st_mode) || st.st_rdev != devfd_rdev || st.st_ino != devfd_ino) {
		/* The number was taken by a restored file: not ours to use. */
		devfd = -1;
		errno = EPERM;
		*out = -1;
		return 1;
	}
	uffd = ioctl(fd, USERFAULTFD_IOC_NEW, (unsigned long)a[0]);
	err = errno;
	if (getpid() != devfd_owner) {
		/* A restored task: it never runs with the device. */
		devfd = -1;
		real_close(fd);
	}
	errno = err;
	*out = uffd;
	return 1;
}
