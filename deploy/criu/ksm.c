/*
 * forkfleet-criu-ksm: preloaded into forkfleet's private CRIU by
 * deploy/host-setup.sh, with rlimits.c in the same library.
 *
 * Replicas of one checkpoint hold the same pages, and KSM merges only what
 * a process opted into. guestd opts the sandbox in at boot
 * (PR_SET_MEMORY_MERGE, inherited by every process it starts), but that
 * flag belongs to the process, not to its mappings, and CRIU does not
 * restore it: a restored Chromium, Xvfb or openbox never merged what it
 * mapped after its restore (4 to 5 MB per browser replica after a minute).
 * The kernel has no call to set the flag for another process; CRIU forks
 * every restored process from itself, so CRIU takes it here and they
 * inherit it. In a dump it only advises CRIU's own buffers. A kernel
 * without the call (< 6.4) refuses it, and nothing changes.
 */
#include <sys/prctl.h>

#ifndef PR_SET_MEMORY_MERGE
#define PR_SET_MEMORY_MERGE 67
#endif

__attribute__((constructor)) static void forkfleet_criu_ksm(void)
{
	prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0);
}
