/*
 * The preload library's one syscall(): CRIU makes the calls the library
 * answers (prlimit64, userfaultfd) through libc's syscall(), so the library
 * overrides it once and offers each refused call to the file that knows it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>

int forkfleet_rlimit_syscall(long nr, const long *a, long r);
int forkfleet_uffd_syscall(long nr, const long *a, long r, long *out);

long syscall(long nr, ...)
{
	static long (*real)(long, ...);
	long a[6], out;
	va_list ap;
	long r;
	int i;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (!real)
		real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	r = real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	if (r != -1)
		return r;
	if (forkfleet_rlimit_syscall(nr, a, r))
		return 0;
	if (forkfleet_uffd_syscall(nr, a, r, &out))
		return out;
	return r;
}
