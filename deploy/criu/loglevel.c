/*
 * forkfleet-criu-loglevel: preloaded into forkfleet's private CRIU by
 * deploy/host-setup.sh, with the other files of the library.
 *
 * runc asks CRIU for its debug log on every restore (libcontainer's Restore
 * sets log_level 4 in the request, with no way to change it), and CRIU in
 * swrk mode takes the level from the request alone, after any config file
 * (cr-service.c setup_logging_from_req). At that level a restore writes a
 * line per write(2): 5,000 lines for the bare desktop, 16,000 for the
 * browser, about 6 ms of CPU per bare replica in perf for the writes alone.
 *
 * So a restore request CRIU reads on its swrk socket has its log level
 * lowered before CRIU unpacks it: one varint byte rewritten in place, so the
 * message keeps its length. The level is the one the request's CRIU config
 * file names in a comment line of its own, "# forkfleet-restore-log-level N"
 * (N from 0 to 4; CRIU skips comments), else 2: warnings and errors, CRIU's
 * default. controld writes that line with its dumps' level (containerdrt
 * criuLogLevel: 4 when it logs at debug, else 2), so restores log as its
 * dumps do. A level is only ever lowered;
 * nothing else of the request changes, and no other request (dumps, checks,
 * the notifications' answers that follow on the socket) is touched. A
 * message that is not a well-formed criu_req is left as it was, for CRIU to
 * judge.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#define DEFAULT_RESTORE_LEVEL 2

#define LEVEL_LINE "# forkfleet-restore-log-level "

/*
 * criu_req: type = 1 (enum, RESTORE = 2), opts = 2; criu_opts: log_level =
 * 9, config_file = 51.
 */
#define REQ_TYPE 1
#define REQ_OPTS 2
#define REQ_TYPE_RESTORE 2
#define OPTS_LOG_LEVEL 9
#define OPTS_CONFIG_FILE 51

static int swrk_fd = -1; /* the swrk socket, from `criu swrk <fd>` */

/* glibc passes the program's arguments and environment to constructors. */
__attribute__((constructor)) static void forkfleet_criu_loglevel(int argc, char **argv)
{
	char *end;
	long fd;

	if (argc < 3 || !argv || strcmp(argv[1], "swrk") != 0)
		return;
	fd = strtol(argv[2], &end, 10);
	if (*argv[2] && *end == '\0' && fd >= 0 && fd < 1 << 20)
		swrk_fd = (int)fd;
}

/* varint reads a protobuf varint at *p (before end); -1 when malformed. */
static int varint(const unsigned char **p, const unsigned char *end, unsigned long long *out)
{
	unsigned long long v = 0;
	int shift;

	for (shift = 0; shift < 64 && *p < end; shift += 7) {
		unsigned char b = *(*p)++;
		v |= (unsigned long long)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*out = v;
			return 0;
		}
	}
	return -1;
}

/*
 * walk calls fn for each field of the message [p, end), with the field's
 * value (a length-delimited one without its length). Returns -1 on a
 * malformed message (or a group: criu_req has none).
 */
typedef void (*field_fn)(unsigned field, unsigned wire, unsigned char *val, unsigned char *val_end, void *arg);

static int walk(unsigned char *p, unsigned char *end, field_fn fn, void *arg)
{
	while (p < end) {
		unsigned long long key, n;
		unsigned char *val;
		const unsigned char *q = p;

		if (varint(&q, end, &key) || key >> 32 || (key >> 3) == 0)
			return -1;
		val = (unsigned char *)q;
		switch (key & 7) {
		case 0:
			if (varint(&q, end, &n))
				return -1;
			break;
		case 1: /* 64-bit */
		case 5: /* 32-bit */
			n = (key & 7) == 1 ? 8 : 4;
			if (n > (unsigned long long)(end - q))
				return -1;
			q += n;
			break;
		case 2:
			if (varint(&q, end, &n) || n > (unsigned long long)(end - q))
				return -1;
			val = (unsigned char *)q;
			q += n;
			break;
		default:
			return -1;
		}
		fn((unsigned)(key >> 3), (unsigned)(key & 7), val, (unsigned char *)q, arg);
		p = (unsigned char *)q;
	}
	return 0;
}

struct req_scan {
	long type;            /* the last type field, -1 when absent */
	unsigned char *opts;  /* the last opts field */
	unsigned char *opts_end;
	int bad;
};

struct opts_scan {
	unsigned char *config;  /* the last config_file field */
	unsigned char *config_end;
	int level;              /* the level to lower log_level to */
};

static void scan_req(unsigned field, unsigned wire, unsigned char *val, unsigned char *val_end, void *arg)
{
	struct req_scan *s = arg;
	const unsigned char *q = val;
	unsigned long long v = 0;

	if (field == REQ_TYPE && wire == 0) {
		s->bad |= varint(&q, val_end, &v) != 0;
		s->type = (long)v;
	} else if (field == REQ_OPTS && wire == 2) {
		s->opts = val;
		s->opts_end = val_end;
	}
}

static void scan_opts(unsigned field, unsigned wire, unsigned char *val, unsigned char *val_end, void *arg)
{
	struct opts_scan *o = arg;

	if (field == OPTS_CONFIG_FILE && wire == 2) {
		o->config = val;
		o->config_end = val_end;
	}
}

/* The log levels in opts that are one byte (0 to 127), lowered in place. */
static void lower_level(unsigned field, unsigned wire, unsigned char *val, unsigned char *val_end, void *arg)
{
	struct opts_scan *o = arg;

	if (field == OPTS_LOG_LEVEL && wire == 0 && val_end - val == 1 && *val > o->level)
		*val = (unsigned char)o->level;
}

/*
 * config_level returns the level a config file's LEVEL_LINE names, or
 * DEFAULT_RESTORE_LEVEL. The file is the one CRIU reads next (runc names
 * controld's, from the sandbox's spec); only its first 64 KiB are looked at.
 */
static int config_level(const unsigned char *name, size_t len)
{
	char path[PATH_MAX], buf[65536];
	const char *p;
	ssize_t n;
	int fd;

	if (len == 0 || len >= sizeof path || memchr(name, '\0', len))
		return DEFAULT_RESTORE_LEVEL;
	memcpy(path, name, len);
	path[len] = '\0';
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return DEFAULT_RESTORE_LEVEL;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return DEFAULT_RESTORE_LEVEL;
	buf[n] = '\0';
	for (p = buf; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		const char *v = p + sizeof LEVEL_LINE - 1;

		if (strncmp(p, LEVEL_LINE, sizeof LEVEL_LINE - 1) == 0 && v[0] >= '0' && v[0] <= '4' &&
		    (v[1] == '\n' || v[1] == '\0'))
			return v[0] - '0';
	}
	return DEFAULT_RESTORE_LEVEL;
}

static void maybe_lower(unsigned char *buf, size_t len)
{
	struct req_scan s = { .type = -1 };
	struct opts_scan o = { 0 };

	if (walk(buf, buf + len, scan_req, &s) || s.bad || s.type != REQ_TYPE_RESTORE || !s.opts)
		return;
	/* The whole of opts is checked before a byte of it changes. */
	if (walk(s.opts, s.opts_end, scan_opts, &o))
		return;
	o.level = o.config ? config_level(o.config, (size_t)(o.config_end - o.config)) : DEFAULT_RESTORE_LEVEL;
	walk(s.opts, s.opts_end, lower_level, &o);
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	static ssize_t (*real)(int, void *, size_t, int);
	ssize_t n;
	int saved;

	if (!real)
		real = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
	n = real(fd, buf, len, flags);
	if (fd != swrk_fd || (flags & MSG_PEEK) || n <= 0 || !buf)
		return n;
	/* MSG_TRUNC reports the whole length; only what was read is ours. */
	saved = errno;
	maybe_lower(buf, (size_t)n < len ? (size_t)n : len);
	errno = saved;
	return n;
}
