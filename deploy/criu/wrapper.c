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
 * answer VERSION: about 5 ms of CPU per replica of a fork. When the first
 * request on the swrk socket is exactly that (a criu_req with type VERSION
 * and no other field) and the version cache matches the CRIU binary, the
 * wrapper sends the cached response and exits 0, as CRIU's cr_service_work
 * does after a request without keep_open. Anything else (another request,
 * other fields, a missing or stale cache, a fd that is no SOCK_SEQPACKET
 * socket) execs the real CRIU with the request still unread on the socket:
 * the wrapper only peeks (MSG_PEEK) before it decides.
 *
 * The cache holds the real CRIU's own response bytes, recorded by
 * `criu forkfleet-record-version FILE` (host-setup runs it after it installs
 * CRIU): a key line "size mtime_sec mtime_nsec ino dev" of the binary, then
 * the response. A CRIU replaced without a new record no longer matches its
 * key, and the real CRIU answers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* criu_req{type: VERSION}: field 1, varint, 10. go-criu sends exactly this. */
static const unsigned char version_req[] = { 0x08, 0x0a };

/* A response is small (a version: two ints, a sublevel, maybe a git id). */
#define MAX_RESP 4096

static void exec_criu(char **argv)
{
	int argc = 0, n = 0;
	char **args;
	const char *conf = getenv("CRIU_CONFIG_FILE");

	if (!conf || !*conf)
		setenv("CRIU_CONFIG_FILE", CRIU_CONF, 1);
	/* GnuTLS initializes itself when loaded (system priorities, its RNG):
	 * about 0.35 ms of every CRIU start. CRIU uses TLS only for a page
	 * server started with --tls, which forkfleet never asks for. */
	setenv("GNUTLS_NO_IMPLICIT_INIT", "1", 1);

	while (argv[argc])
		argc++;
	args = calloc(argc + 8, sizeof(*args));
	if (!args) {
		perror("criu wrapper");
		exit(1);
	}
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
	for (int i = 1; i < argc; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	execv(CRIU_LOADER, args);
	fprintf(stderr, "criu wrapper: exec %s: %s\n", CRIU_LOADER, strerror(errno));
	exit(1);
}

/* binary_key: the CRIU binary's identity as the cache's first line. */
static int binary_key(char *out, size_t len)
{
	struct stat st;

	if (stat(CRIU_BINARY, &st) != 0)
		return -1;
	snprintf(out, len, "%jd %jd %ld %ju %ju\n", (intmax_t)st.st_size, (intmax_t)st.st_mtim.tv_sec,
		 st.st_mtim.tv_nsec, (uintmax_t)st.st_ino, (uintmax_t)st.st_dev);
	return 0;
}

/* cached_response: the recorded response when its key is the binary's. */
static ssize_t cached_response(unsigned char *resp, size_t len)
{
	char key[128], buf[MAX_RESP + 128], *nl;
	ssize_t n, total = 0;
	size_t klen;
	int fd;

	if (binary_key(key, sizeof(key)) != 0)
		return -1;
	fd = open(CRIU_VERSION_CACHE, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while ((size_t)total < sizeof(buf)) {
		n = read(fd, buf + total, sizeof(buf) - total);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		total += n;
	}
	close(fd);
	if ((size_t)total == sizeof(buf))
		return -1; /* larger than any response: not a cache of ours */
	nl = memchr(buf, '\n', total);
	if (!nl)
		return -1;
	klen = nl - buf + 1;
	if (klen != strlen(key) || memcmp(buf, key, klen) != 0)
		return -1;
	if ((size_t)total - klen == 0 || (size_t)total - klen > len)
		return -1;
	memcpy(resp, buf + klen, total - klen);
	return total - klen;
}

/* parse_fd: a plain decimal fd, as runc passes it. */
static int parse_fd(const char *s)
{
	long v = 0;

	if (!*s || strlen(s) > 9)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
	}
	return (int)v;
}

/* answer_version: 0 when the swrk request was VERSION and is answered. */
static int answer_version(int sk)
{
	unsigned char resp[MAX_RESP], req[sizeof(version_req) + 1];
	int type = 0;
	socklen_t tlen = sizeof(type);
	ssize_t rlen, n;

	if (getsockopt(sk, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_SEQPACKET)
		return -1;
	rlen = cached_response(resp, sizeof(resp));
	if (rlen <= 0)
		return -1;
	do
		n = recv(sk, req, sizeof(req), MSG_PEEK | MSG_TRUNC);
	while (n < 0 && errno == EINTR);
	if (n != sizeof(version_req) || memcmp(req, version_req, sizeof(version_req)) != 0)
		return -1;
	/* Consume it (the peeked message, no other reader), then answer. */
	do
		n = recv(sk, req, sizeof(req), 0);
	while (n < 0 && errno == EINTR);
	if (n != sizeof(version_req)) {
		/* Cannot happen on a SOCK_SEQPACKET socket only we read; CRIU
		 * would fail its recv the same way. */
		exit(1);
	}
	do
		n = write(sk, resp, rlen);
	while (n < 0 && errno == EINTR);
	/* CRIU exits 1 when it cannot send a response (runc sees the error
	 * on its read), 0 after a response. */
	exit(n == rlen ? 0 : 1);
}

/* record_version: asks the real CRIU for its version over swrk and writes
 * the cache (key and response) to path, atomically. */
static int record_version(char *self, const char *path)
{
	char key[128], after[128], fdstr[16], tmp[4096];
	unsigned char resp[MAX_RESP];
	int sv[2], status, fd;
	ssize_t n;
	pid_t pid;

	if (binary_key(key, sizeof(key)) != 0) {
		fprintf(stderr, "criu wrapper: stat %s: %s\n", CRIU_BINARY, strerror(errno));
		return 1;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
		perror("criu wrapper: socketpair");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("criu wrapper: fork");
		return 1;
	}
	if (pid == 0) {
		char *argv[] = { self, "swrk", fdstr, NULL };

		close(sv[0]);
		snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
		exec_criu(argv);
	}
	close(sv[1]);
	if (write(sv[0], version_req, sizeof(version_req)) != sizeof(version_req)) {
		perror("criu wrapper: send VERSION");
		return 1;
	}
	n = recv(sv[0], resp, sizeof(resp), MSG_TRUNC);
	close(sv[0]);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "criu wrapper: criu swrk did not exit 0 after VERSION\n");
		return 1;
	}
	if (n <= 0 || (size_t)n > sizeof(resp) || resp[0] != 0x08 || resp[1] != 0x0a) {
		fprintf(stderr, "criu wrapper: criu swrk gave no VERSION response\n");
		return 1;
	}
	if (binary_key(after, sizeof(after)) != 0 || strcmp(key, after) != 0) {
		fprintf(stderr, "criu wrapper: %s changed while its version was read\n", CRIU_BINARY);
		return 1;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, key, strlen(key)) != (ssize_t)strlen(key) || write(fd, resp, n) != n ||
	    fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr, "criu wrapper: write %s: %s\n", path, strerror(errno));
		unlink(tmp);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "swrk") == 0) {
		int sk = parse_fd(argv[2]);

		if (sk >= 0)
			answer_version(sk); /* exits when it answered */
	} else if (argc == 3 && strcmp(argv[1], "forkfleet-record-version") == 0) {
		return record_version(argv[0], argv[2]);
	}
	exec_criu(argv);
	return 1;
}
