/*
 * forkfleet-criu-rlimits: preloaded into forkfleet's private CRIU by
 * deploy/host-setup.sh (its syscall() is syscall.c's).
 *
 * CRIU reads each dumped task's resource limits with prlimit64(pid, res,
 * NULL, &old). Across users the kernel allows that only with CAP_SYS_RESOURCE
 * (or when CRIU's real ids equal all of the task's), and some hosts' root
 * lacks it: on these VMs it is missing from the bounding set. A sandbox whose
 * agent runs as its own user next to a root guestd (guestd.json "user") could
 * then never be dumped: "Can't get rlimit 0: Operation not permitted".
 *
 * When such a read is refused, this answers it from /proc/<pid>/limits,
 * which the kernel shows to everyone: the same values, read another way.
 * Nothing else changes; with CAP_SYS_RESOURCE the shim never acts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>

/*
 * /proc/<pid>/limits: a header, then one line per resource in RLIMIT_*
 * order, "%-25s %-20s %-20s %-10s" (name, soft, hard, units); a value is a
 * number or "unlimited". CRIU asks for every resource of a task in a row:
 * the file is read once per task.
 */
#define NLIMITS 16

static long cached_pid;
static struct rlimit64 cached[NLIMITS];

static int read_limits(long pid)
{
	char path[64], line[256], soft[32], hard[32];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%ld/limits", pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (!fgets(line, sizeof(line), f)) { /* the header */
		fclose(f);
		return -1;
	}
	for (; n < NLIMITS && fgets(line, sizeof(line), f); n++) {
		if (strlen(line) < 48 || sscanf(line + 26, "%31s", soft) != 1 || sscanf(line + 47, "%31s", hard) != 1)
			break;
		cached[n].rlim_cur = strcmp(soft, "unlimited") ? strtoull(soft, NULL, 10) : RLIM64_INFINITY;
		cached[n].rlim_max = strcmp(hard, "unlimited") ? strtoull(hard, NULL, 10) : RLIM64_INFINITY;
	}
	fclose(f);
	if (n < NLIMITS) /* not the layout this reads: refuse like the kernel */
		return -1;
	cached_pid = pid;
	return 0;
}

static int limit_from_proc(long pid, long res, struct rlimit64 *out)
{
	if (res < 0 || res >= NLIMITS)
		return -1;
	if (res == 0 || pid != cached_pid) {
		/* A new task, or the same pid dumped again: read it afresh. */
		cached_pid = 0;
		if (read_limits(pid))
			return -1;
	}
	*out = cached[res];
	return 0;
}

/*
 * forkfleet_rlimit_syscall: called by syscall.c's syscall() after the real
 * call returned r. Returns 1 when it answered a refused read of another
 * task's limit (the call then returns 0), else 0.
 */
int forkfleet_rlimit_syscall(long nr, const long *a, long r)
{
	/* A read (no new limit) of another task's limit, refused. */
	if (r == -1 && errno == EPERM && nr == SYS_prlimit64 && a[0] > 0 && a[2] == 0 && a[3] != 0) {
		if (limit_from_proc(a[0], a[1], (struct rlimit64 *)a[3]) == 0)
			return 1;
		errno = EPERM;
	}
	return 0;
}
