/*
 * forkfleet-criu-wrapper: /usr/local/sbin/criu, built by deploy/host-setup.sh
 * (build_criu_wrapper) with the private CRIU's paths compiled in.
 *
 * It runs the private CRIU of CRIU_PREFIX through that prefix's own loader,
 * so the host's libraries are never mixed in, with its preload library and
 * CRIU_CONFIG_FILE (honoured in swrk mode) set. It execs, never forks, so
 * runc's fds, signals and exit status pass straight through.
 *
 * One request it answers itself: `runc restore` asks CRIU's version before
 * every restore (runc's checkCriuVersion, go-criu's GetCriuVersion), with a
 * `criu swrk <fd>` of its own that loads CRIU and its libraries only to
 * answer VERSION: about 3.5 ms of CPU per replica of a fork. When the first
 * request on the swrk socket is exactly that (a criu_req with type VERSION
 * and no other field) and the version cache matches the CRIU binary, the
 * wrapper sends the cached response and exits 0, as CRIU's cr_service_work
 * does after a request without keep_open. Anything else (another request,
 * other fields, a missing or stale cache, a fd that is no SOCK_SEQPACKET
 * socket) execs the real CRIU with the request still unread on the socket:
 * the wrapper only peeks (MSG_PEEK) before it decides. It waits for that
 * first request 10 ms at most, and not at all for a client that sets
 * FORKFLEET_CRIU_WRAPPER_EXEC (controld, whose dumps start CRIU ahead of
 * their request, before the sandbox is frozen).
 *
 * The cache holds the real CRIU's own response bytes, recorded by
 * `criu forkfleet-record-version FILE` (host-setup runs it after it installs
 * CRIU): a key line "size mtime_sec mtime_nsec ino dev_major dev_minor" of
 * the binary, then the response. A CRIU replaced without a new record no
 * longer matches its key, and the real CRIU answers.
 *
 * No libc: the wrapper is linked -nostdlib and makes its few system calls
 * itself. glibc's start-up reads the CPU's cache geometry with dozens of
 * CPUID instructions, and on a VM each one traps to the hypervisor: an
 * empty glibc program costs 0.85 ms of CPU on the Firecracker hosts
 * forkfleet is measured on, this one 0.03 ms, twice per restore.
 */
#include <asm/socket.h>
#include <asm/unistd.h>
#include <linux/fcntl.h>
#include <linux/stat.h>

#define POLLIN 0x1
#define MSG_PEEK 0x2
#define MSG_TRUNC 0x20
#define AF_UNIX 1
#define SOCK_SEQPACKET 5
#define SIGCHLD 17
#define EINTR 4

#ifndef CRIU_LOADER
#error "CRIU_LOADER (the loader of the private CRIU) must be defined"
#endif
#ifndef CRIU_LIBPATH
#error "CRIU_LIBPATH (the library directories of the private CRIU) must be defined"
#endif
#ifndef CRIU_BINARY
#error "CRIU_BINARY (the executable of the private CRIU) must be defined"
#endif
#ifndef CRIU_CONF
#error "CRIU_CONF (the default CRIU_CONFIG_FILE) must be defined"
#endif
#ifndef CRIU_VERSION_CACHE
#error "CRIU_VERSION_CACHE (the recorded VERSION response) must be defined"
#endif
#ifndef CRIU_PRELOAD
#define CRIU_PRELOAD ""
#endif

/* host-setup's is_our_wrapper looks for this line in the installed file. */
__attribute__((used)) static const char marker[] =
	"# forkfleet-criu-wrapper (built by deploy/host-setup.sh from deploy/criu/wrapper.c; do not edit)";

/* What the wrapper runs, for those who inspect it (the node image's test). */
__attribute__((used)) static const char paths[] =
	"forkfleet-criu-wrapper-paths: loader=" CRIU_LOADER " preload=" CRIU_PRELOAD " library-path=" CRIU_LIBPATH
	" binary=" CRIU_BINARY " conf=" CRIU_CONF " version-cache=" CRIU_VERSION_CACHE "\n";

/* criu_req{type: VERSION}: field 1, varint, 10. go-criu sends exactly this. */
static const unsigned char version_req[] = { 0x08, 0x0a };

/*
 * How long the wrapper waits for the first request. runc writes VERSION as
 * soon as its exec of the wrapper returned; a client that starts CRIU ahead
 * of its request (controld's dumps start CRIU before the freeze) must not
 * find CRIU unloaded when the request comes: such a client sets
 * NO_ANSWER_VAR, and any other gets CRIU after this long at most.
 */
#define FIRST_REQUEST_WAIT_NS 10000000L
#define NO_ANSWER_VAR "FORKFLEET_CRIU_WRAPPER_EXEC="

/* A response is small (a version: two ints, a sublevel, maybe a git id). */
#define MAX_RESP 4096
/* Arguments and environment entries the wrapper passes on. */
#define MAX_VEC 4096

/* ---------------------------------------------------------------- system calls */

#if defined(__x86_64__)
__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	xor %rbp, %rbp\n"
	"	mov %rsp, %rdi\n"
	"	and $-16, %rsp\n"
	"	call wrapper_main\n"
	"	hlt\n");

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#elif defined(__aarch64__)
__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	mov x29, #0\n"
	"	mov x30, #0\n"
	"	mov x0, sp\n"
	"	and sp, x0, #-16\n"
	"	bl wrapper_main\n"
	"	brk #0\n");

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;

	__asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
	return x0;
}
#else
#error "the CRIU wrapper supports x86_64 and aarch64"
#endif

#define sys(n, a, b, c) sys6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)

/* The compiler may call these for copies and zeroing even without libc. */
void *memcpy(void *d, const void *s, unsigned long n)
{
	unsigned char *dp = d;
	const unsigned char *sp = s;

	while (n--)
		*dp++ = *sp++;
	return d;
}

void *memset(void *d, int c, unsigned long n)
{
	unsigned char *dp = d;

	while (n--)
		*dp++ = (unsigned char)c;
	return d;
}

static unsigned long str_len(const char *s)
{
	unsigned long n = 0;

	while (s[n])
		n++;
	return n;
}

static int mem_eq(const void *a, const void *b, unsigned long n)
{
	const unsigned char *ap = a, *bp = b;

	for (unsigned long i = 0; i < n; i++)
		if (ap[i] != bp[i])
			return 0;
	return 1;
}

static int str_eq(const char *a, const char *b)
{
	unsigned long n = str_len(a);

	return n == str_len(b) && mem_eq(a, b, n);
}

static __attribute__((noreturn)) void die(int code)
{
	for (;;)
		sys(__NR_exit_group, code, 0, 0);
}

static void say(const char *a, const char *b)
{
	sys(__NR_write, 2, "criu wrapper: ", 14);
	sys(__NR_write, 2, a, str_len(a));
	if (b)
		sys(__NR_write, 2, b, str_len(b));
	sys(__NR_write, 2, "\n", 1);
}

/* put_uint appends v in decimal to out at *pos (out has room: callers size it). */
static void put_uint(char *out, unsigned long *pos, unsigned long long v, char sep)
{
	char digits[24];
	int n = 0;

	do
		digits[n++] = (char)('0' + v % 10);
	while ((v /= 10) != 0);
	while (n)
		out[(*pos)++] = digits[--n];
	out[(*pos)++] = sep;
}

/* ---------------------------------------------------------------- CRIU */

static __attribute__((noreturn)) void exec_criu(char **argv, char **envp)
{
	static char *args[MAX_VEC], *env[MAX_VEC];
	static const char conf_var[] = "CRIU_CONFIG_FILE=", tls_var[] = "GNUTLS_NO_IMPLICIT_INIT=";
	int n = 0, e = 0, has_conf = 0;

	/* CRIU_CONFIG_FILE unless set (and not empty); GnuTLS initializes
	 * itself when loaded (system priorities, its RNG): about 0.35 ms of
	 * every CRIU start. CRIU uses TLS only for a page server started with
	 * --tls, which forkfleet never asks for. */
	for (; *envp; envp++) {
		if (mem_eq(*envp, conf_var, sizeof(conf_var) - 1)) {
			if (!(*envp)[sizeof(conf_var) - 1])
				continue;
			has_conf = 1;
		} else if (mem_eq(*envp, tls_var, sizeof(tls_var) - 1)) {
			continue;
		}
		if (e >= MAX_VEC - 3) {
			say("too many environment variables", 0);
			die(1);
		}
		env[e++] = *envp;
	}
	if (!has_conf)
		env[e++] = "CRIU_CONFIG_FILE=" CRIU_CONF;
	env[e++] = "GNUTLS_NO_IMPLICIT_INIT=1";
	env[e] = 0;

	args[n++] = CRIU_LOADER;
	args[n++] = "--argv0";
	args[n++] = "criu";
	if (CRIU_PRELOAD[0]) {
		args[n++] = "--preload";
		args[n++] = CRIU_PRELOAD;
	}
	args[n++] = "--library-path";
	args[n++] = CRIU_LIBPATH;
	args[n++] = CRIU_BINARY;
	for (int i = 1; argv[0] && argv[i]; i++) {
		if (n >= MAX_VEC - 1) {
			say("too many arguments", 0);
			die(1);
		}
		args[n++] = argv[i];
	}
	args[n] = 0;
	sys(__NR_execve, CRIU_LOADER, args, env);
	say("cannot exec ", CRIU_LOADER);
	die(1);
}

/* binary_key: the CRIU binary's identity, the cache's first line. */
static int binary_key(char *out, unsigned long len)
{
	struct statx st;
	unsigned long pos = 0;

	if (len < 6 * 21 + 1)
		return -1;
	if (sys6(__NR_statx, AT_FDCWD, (long)CRIU_BINARY, 0, STATX_BASIC_STATS, (long)&st, 0) != 0)
		return -1;
	put_uint(out, &pos, st.stx_size, ' ');
	put_uint(out, &pos, (unsigned long long)st.stx_mtime.tv_sec, ' ');
	put_uint(out, &pos, st.stx_mtime.tv_nsec, ' ');
	put_uint(out, &pos, st.stx_ino, ' ');
	put_uint(out, &pos, st.stx_dev_major, ' ');
	put_uint(out, &pos, st.stx_dev_minor, '\n');
	out[pos] = 0;
	return (int)pos;
}

/* cached_response: the recorded response when its key is the binary's. */
static long cached_response(unsigned char *resp, unsigned long len)
{
	static char buf[MAX_RESP + 256];
	char key[256];
	long n, total = 0, fd, klen, nl = -1;

	klen = binary_key(key, sizeof(key));
	if (klen <= 0)
		return -1;
	fd = sys6(__NR_openat, AT_FDCWD, (long)CRIU_VERSION_CACHE, O_RDONLY | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return -1;
	while (total < (long)sizeof(buf)) {
		n = sys(__NR_read, fd, buf + total, sizeof(buf) - total);
		if (n == -EINTR)
			continue;
		if (n < 0) {
			sys(__NR_close, fd, 0, 0);
			return -1;
		}
		if (n == 0)
			break;
		total += n;
	}
	sys(__NR_close, fd, 0, 0);
	if (total == (long)sizeof(buf))
		return -1; /* larger than any response: not a cache of ours */
	for (long i = 0; i < total; i++)
		if (buf[i] == '\n') {
			nl = i;
			break;
		}
	if (nl + 1 != klen || !mem_eq(buf, key, klen))
		return -1;
	if (total - klen <= 0 || total - klen > (long)len)
		return -1;
	memcpy(resp, buf + klen, total - klen);
	return total - klen;
}

/* parse_fd: a plain decimal fd, as runc passes it. */
static long parse_fd(const char *s)
{
	long v = 0;

	if (!*s || str_len(s) > 9)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v;
}

/* answer_version: exits when the swrk request was VERSION and is answered;
 * returns otherwise, the request unread. */
static void answer_version(long sk)
{
	static unsigned char resp[MAX_RESP];
	unsigned char req[sizeof(version_req) + 1];
	int type = 0;
	unsigned int tlen = sizeof(type);
	long rlen, n;

	if (sys6(__NR_getsockopt, sk, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tlen, 0) != 0 ||
	    type != SOCK_SEQPACKET)
		return;
	rlen = cached_response(resp, sizeof(resp));
	if (rlen <= 0)
		return;
	struct {
		int fd;
		short events, revents;
	} pfd = { (int)sk, POLLIN, 0 };
	struct {
		long sec, nsec;
	} wait = { 0, FIRST_REQUEST_WAIT_NS };
	do
		n = sys6(__NR_ppoll, (long)&pfd, 1, (long)&wait, 0, 0, 0);
	while (n == -EINTR);
	if (n != 1)
		return; /* no request yet (or an error): CRIU waits for it */
	do
		n = sys6(__NR_recvfrom, sk, (long)req, sizeof(req), MSG_PEEK | MSG_TRUNC, 0, 0);
	while (n == -EINTR);
	if (n != sizeof(version_req) || !mem_eq(req, version_req, sizeof(version_req)))
		return;
	/* Consume it (the peeked message: no other reader), then answer. */
	do
		n = sys6(__NR_recvfrom, sk, (long)req, sizeof(req), 0, 0, 0);
	while (n == -EINTR);
	if (n != sizeof(version_req))
		die(1); /* as CRIU, whose recv would fail the same way */
	do
		n = sys(__NR_write, sk, resp, rlen);
	while (n == -EINTR);
	/* CRIU exits 1 when it cannot send a response (runc then sees the
	 * error on its read), 0 after a response. */
	die(n == rlen ? 0 : 1);
}

static long write_all(long fd, const void *p, long len)
{
	const char *c = p;
	long n;

	while (len > 0) {
		n = sys(__NR_write, fd, c, len);
		if (n == -EINTR)
			continue;
		if (n <= 0)
			return -1;
		c += n;
		len -= n;
	}
	return 0;
}

/* record_version: asks the real CRIU for its version over swrk and writes
 * the cache (key and response) to path, atomically. */
static int record_version(const char *path, char **envp)
{
	static unsigned char resp[MAX_RESP];
	static char tmp[4096];
	char key[256], after[256], fdstr[24];
	int sv[2], status = 0;
	long n, pid, fd, klen;
	unsigned long pos = 0, plen = str_len(path);

	klen = binary_key(key, sizeof(key));
	if (klen <= 0) {
		say("cannot stat ", CRIU_BINARY);
		return 1;
	}
	if (sys6(__NR_socketpair, AF_UNIX, SOCK_SEQPACKET, 0, (long)sv, 0, 0) != 0) {
		say("socketpair failed", 0);
		return 1;
	}
	pid = sys6(__NR_clone, SIGCHLD, 0, 0, 0, 0, 0);
	if (pid < 0) {
		say("fork failed", 0);
		return 1;
	}
	if (pid == 0) {
		char *argv[] = { "criu", "swrk", fdstr, 0 };

		sys(__NR_close, sv[0], 0, 0);
		put_uint(fdstr, &pos, (unsigned long long)sv[1], 0);
		exec_criu(argv, envp);
	}
	sys(__NR_close, sv[1], 0, 0);
	if (sys(__NR_write, sv[0], version_req, sizeof(version_req)) != sizeof(version_req)) {
		say("cannot send VERSION to criu swrk", 0);
		return 1;
	}
	do
		n = sys6(__NR_recvfrom, sv[0], (long)resp, sizeof(resp), MSG_TRUNC, 0, 0);
	while (n == -EINTR);
	sys(__NR_close, sv[0], 0, 0);
	while (sys6(__NR_wait4, pid, (long)&status, 0, 0, 0, 0) == -EINTR)
		;
	if ((status & 0xffff) != 0) {
		say("criu swrk did not exit 0 after VERSION", 0);
		return 1;
	}
	if (n <= 2 || n > (long)sizeof(resp) || resp[0] != 0x08 || resp[1] != 0x0a) {
		say("criu swrk gave no VERSION response", 0);
		return 1;
	}
	if (binary_key(after, sizeof(after)) != klen || !mem_eq(key, after, klen)) {
		say(CRIU_BINARY, " changed while its version was read");
		return 1;
	}
	if (plen + 8 > sizeof(tmp)) {
		say("path too long: ", path);
		return 1;
	}
	memcpy(tmp, path, plen);
	memcpy(tmp + plen, ".tmp", 5);
	fd = sys6(__NR_openat, AT_FDCWD, (long)tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644, 0, 0);
	if (fd < 0 || write_all(fd, key, klen) != 0 || write_all(fd, resp, n) != 0 ||
	    sys(__NR_fsync, fd, 0, 0) != 0 || sys(__NR_close, fd, 0, 0) != 0 ||
	    sys6(__NR_renameat2, AT_FDCWD, (long)tmp, AT_FDCWD, (long)path, 0, 0) != 0) {
		say("cannot write ", path);
		sys(__NR_unlinkat, AT_FDCWD, tmp, 0);
		return 1;
	}
	return 0;
}

__attribute__((noreturn, used)) void wrapper_main(long *sp)
{
	long argc = sp[0];
	char **argv = (char **)(sp + 1);
	char **envp = argv + argc + 1;

	if (argc == 3 && str_eq(argv[1], "swrk")) {
		long sk = parse_fd(argv[2]);
		int answer = 1;

		for (char **e = envp; *e; e++)
			if (mem_eq(*e, NO_ANSWER_VAR, sizeof(NO_ANSWER_VAR) - 1))
				answer = 0;
		if (sk >= 0 && answer)
			answer_version(sk); /* exits when it answered */
	} else if (argc == 3 && str_eq(argv[1], "forkfleet-record-version")) {
		die(record_version(argv[2], envp));
	}
	exec_criu(argv, envp);
}
