/*
 * pagecost: what filling fresh anonymous memory costs on this host, the way a
 * restore fills it (preadv from the page cache into a new mapping).
 * gcc -O2 -o pagecost pagecost.c && head -c 64M /dev/urandom >/tmp/pagecost.data && ./pagecost 20
 * Each mode: 5 rounds over N MiB, process CPU time per 4 KiB page.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double cpu_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void fill(int fd, char *p, size_t sz)
{
	for (size_t done = 0; done < sz;) {
		struct iovec iov = {p + done, sz - done > (1 << 20) ? (1 << 20) : sz - done};
		ssize_t n = preadv(fd, &iov, 1, done);
		if (n <= 0)
			exit(1);
		done += n;
	}
}

int main(int argc, char **argv)
{
	size_t sz = (size_t)atoi(argc > 1 ? argv[1] : "20") << 20, pages = sz / 4096;
	int fd = open("/tmp/pagecost.data", O_RDONLY);
	const char *names[] = {"write one byte a page", "preadv into a fresh mapping",
			       "MADV_POPULATE_WRITE only", "preadv after MADV_POPULATE_WRITE (preadv timed)",
			       "preadv into a fresh MADV_HUGEPAGE mapping"};
	if (fd < 0)
		return 1;
	for (int mode = 0; mode < 5; mode++)
		for (int rep = 0; rep < 5; rep++) {
			char *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			double c0 = cpu_ms();
			if (mode == 0)
				for (size_t o = 0; o < sz; o += 4096)
					p[o] = 1;
			if (mode == 1)
				fill(fd, p, sz);
			if (mode == 2 || mode == 3)
				madvise(p, sz, 23 /* MADV_POPULATE_WRITE */);
			if (mode == 3) {
				c0 = cpu_ms();
				fill(fd, p, sz);
			}
			if (mode == 4) {
				madvise(p, sz, MADV_HUGEPAGE);
				fill(fd, p, sz);
			}
			printf("%-50s %6.1f us/page\n", names[mode], (cpu_ms() - c0) * 1000 / pages);
			munmap(p, sz);
		}
	return 0;
}
