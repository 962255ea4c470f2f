// Package containerdrt is controld's sandbox runtime on containerd, runc and
// CRIU: it boots desktop sandboxes, freezes them, checkpoints them live and
// forks replicas from a checkpoint. It implements runtime.Runtime.
//
// Layout of a sandbox (id X):
//   - containerd container X (runtime io.containerd.runc.v2) with labels
//     forkfleet.* (see labels.go), overlayfs snapshot X;
//   - cgroup v1 path <CgroupParent>/X in every hierarchy (its own, also for
//     forks: a fork must never share its source's cgroup);
//   - its network namespace, made by controld (package network) before the
//     container and joined by path (lo up; in mode egress also eth0, routes
//     and a resolver mounted over /etc/resolv.conf), /run on the writable
//     layer (guestd's socket /run/forkfleet/aci.sock), stdio appended to
//     <StateDir>/logs/X.log.
//
// A checkpoint is a directory (CheckpointSpec.Dir) holding checkpoint.json,
// spec.json (the source's OCI spec) and, for the memory tier, criu/ (CRIU
// images), plus a committed overlayfs snapshot of the source's writable layer
// labelled containerd.io/gc.root.
//
// Contract with callers, relied on by the memory tier:
//   - No connection from outside the sandbox to a unix socket inside it may be
//     open when Checkpoint freezes the sandbox (CRIU cannot dump a stream
//     socket whose peer lives outside the dumped tree). controld closes its
//     guestd sessions in BeforeFreeze at the latest. Checkpoint then waits
//     (Config.SettleTimeout) for the sandbox to close its ends and for
//     queued connections to be accepted, and fails with
//     ErrFailedPrecondition, without freezing, if some stay open. A
//     connection slipping in between that check and the freeze makes CRIU
//     fail; the sandbox is then thawed for a moment and dumped again (up to
//     Config.DumpAttempts; the hooks run once). Established TCP connections
//     and listening sockets are dumped and restored (CRIU tcp-established);
//     a fork's connections to the outside are closed right after its
//     restore, those within the sandbox survive.
//   - A restored process keeps the memory of its source, including the
//     environment it was started with: for a memory-tier fork the
//     FORKFLEET_* variables and tokens of BootSpec do not reach the restored
//     guestd (they do reach a disk-tier fork, which boots fresh). The caller
//     re-keys a restored guestd through its admin channel.
package containerdrt
