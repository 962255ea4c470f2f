// Package lazypages is controld's page server for CRIU lazy restores: it
// replaces `criu lazy-pages` for one `criu restore --lazy-pages` and
// serves the restored tasks' memory from the checkpoint's images through
// the userfaultfds CRIU hands over (controld/docs/forks.md, "Lazy restore
// with CRIU 4.2", says why CRIU's daemon does not pay here).
//
// Use, per checkpoint and per replica:
//
//	im, err := lazypages.Open(imagesDir) // CRIU's images, once per checkpoint, shared
//	s, err := lazypages.Listen(ctx, im, workDir) // before `criu restore --lazy-pages --work-dir workDir`
//	... restore, verify the replica (its working set faults in) ...
//	s.Complete() // then the rest is copied in the background
//	<-s.Done(); s.Err(); s.Stats()
//	s.Close()
//
// Protocol (CRIU 4.2, criu/uffd.c): the restore connects to
// <work-dir>/lazy-pages.socket and sends, per restored task, its pid as a
// native int (the dumped, in-namespace pid: pagemap-<pid>.img) and then one
// byte carrying the task's uffd in SCM_RIGHTS; a task without memory (a
// zombie) sends its pid negated and no uffd; once every task is restored it
// sends LAZY_PAGES_RESTORE_FINISHED. The uffds were opened with
// UFFD_FEATURE_EVENT_FORK, REMAP, REMOVE and UNMAP, and every lazy VMA
// (private anonymous) is registered for missing pages.
//
// What is lazy (criu/mem.c, criu/pagemap.c): pagemap entries flagged
// PE_LAZY; their pages are in pages-<id>.img (PE_PRESENT) at the offset the
// present entries before them add up to. Entries without flags are present
// (older images); in_parent/PE_PARENT pages (incremental dumps) and lazy
// pages not in the images (a lazy dump's remote pages) are refused: this
// kernel has no dirty tracking, so controld makes neither. Any other fault
// in a registered range is a page the dump found empty: it gets the zero
// page.
//
// Serving: a fault brings its neighbourhood, since faults come in runs (a
// framebuffer hash, a heap walk) and one copy of 64 pages costs little
// more than one of a page. Its first copy (64 KiB of its lazy run, or the
// run whole when small) wakes it; the rest of WithFaultChunk (1 MiB from
// the fault: lazy pages, and zero pages for the holes between runs) is
// queued and filled while no other fault waits, newest first, so one
// process's neighbourhood never delays another's fault. A fault inside or
// right after its process's previous neighbourhood is a stream outrunning
// that: it gets the whole chunk at once. Nothing is copied in the
// background until Complete; then the remaining pages go in chunks
// (WithBackgroundChunk) only while no fault or neighbourhood waits, and the
// session ends (Done) once every process has them all.
//
// Working set (hot.go): what a session's faults brought in until Complete
// (the replica verified) is added to its Images' hot set, one bit per page
// of a pages image. A later session of the checkpoint copies those pages
// into each task as soon as CRIU's restorer has registered the task's
// memory (a copy refused with ENOENT before the restore finished is tried
// again a millisecond later: the uffd comes before the registration), in
// 256 KiB copies behind faults and their neighbourhoods: the replica runs
// with them in. The first lazy fork of a checkpoint learns it; a sandbox
// can at most make its own later replicas copy every lazy page up front.
// Images.KeepHot persists it (hotfile.go) in a file of controld's own,
// written a second after a session grew it and at Close, and checked
// against the images when it is read back: a controld restart does not
// learn it again; a file that does not match is ignored, with its reason.
//
// Races are handled as CRIU's daemon does: EEXIST (the page is there),
// EAGAIN (the mm is changing: the fault is retried after the event that
// changes it), ENOENT (no registered VMA there any more), ESRCH/ENOSPC
// (the process is gone). A fork gives a new uffd for the child, which
// misses what its parent missed when it forked: the kernel fails copies
// into the parent with EAGAIN until the fork event is read, and each
// message is handled before the next is read, so the parent's set is
// exact when it is cloned. Remove and unmap drop ranges; remap moves them.
//
// Measured (TestIntegrationCRIULazyRestore, a Go process holding 256 MiB
// of patterned memory, one page in 64 never touched, dumped once and
// restored lazily with this package and with `criu lazy-pages`, back to
// back, 5 reps, under the bench lock on a quiet host; medians in ms from
// the restore's start; this package as of 512d7cb;
// benchd/results/2026-12-02/lazypages-criu-114858.txt):
//
//	                            lazypages  criu lazy-pages
//	criu restore returned            25.0             37.8
//	1100 pages read (the last)       30.9             97.5
//	forked child read all           200.1            292.1
//	process read all                353.9            344.2
//	every page in                   359.1            344.9
//
// At 64 MiB: 26.7 against 73.3 ms to the 1100 pages, 104.0 against 116.1
// to every page in. The working set comes 3x sooner (3 to 4 ms after the
// process runs, against 40 to 60: the daemon serves it a page at a time
// behind its 4 MiB background copies); reading everything by faults costs
// about what CRIU's background copy does. In a run before (niced, no
// lock), a fault chunk of 256 KiB read 256 MiB 40% slower than 1 MiB; 4
// MiB was no better. At 512d7cb every fault copied its whole chunk at
// once; the queued neighbourhoods (for replicas whose processes fault at
// the same time) came after and are not in these numbers.
//
// The caller's rules:
//   - Pin: an Images holds read-only, shared mappings of the pages images,
//     so removing the checkpoint directory does not take pages from a
//     replica being served. Images.Close drops the owner's reference; the
//     mappings go with the last session. Open it once per checkpoint, close
//     it when the checkpoint is deleted.
//   - Zeros: closing a uffd with pages still missing makes them read as
//     zeros in the replica. A session that did not end with Done and a nil
//     Err (failed, or closed early) did that: kill the replica, never let
//     it run on.
//   - Never a hang: ctx bounds the restore (until CRIU says it finished); a
//     restore that closes the socket before that fails the session
//     (ErrUnavailable); Close always returns.
//
// Images come from a sandbox's checkpoint or an import, so they are
// hostile: files are opened with O_NOFOLLOW|O_NONBLOCK and must be regular,
// sizes and counts are bounded, entries must be page aligned, ordered and
// disjoint, inside lazy VMAs, and within the pages image. Bad images are
// errdefs.ErrInvalidArgument, unsupported ones ErrFailedPrecondition.
package lazypages
