/*
 * compatprobe runs inside a test sandbox (copied in through the ACI) for
 * TestRealStackNativeSyscallsOnly. One thread, no libc (built with
 * gcc -static -nostdlib): it writes "native" through the x86-64 ABI, makes
 * getpid through the i386 ABI (int 0x80), then writes "i386" and exits 0.
 * A filter that refuses the i386 ABI kills it with SIGSYS before the second
 * line.
 */
static long sys3(long nr, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
}

void _start(void)
{
	long ret;
	sys3(1, 1, (long)"native\n", 7); /* write */
	__asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory"); /* i386 getpid */
	sys3(1, 1, (long)"i386\n", 5);
	sys3(60, 0, 0, 0); /* exit */
	for (;;)
		;
}
