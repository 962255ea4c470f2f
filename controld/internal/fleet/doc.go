// Package fleet is controld's manager: the records of sandboxes, checkpoints
// and pools (one registry, guarded by its mu and kept in the store), and
// the operations on them. The runtime contract it drives lives in
// controld/internal/runtime; the gRPC handlers in controld/internal/server.
//
// Manager is the API the handlers call, a facade: each concern is a type
// of its own that embeds the registry (the records and the plumbing every
// concern shares) and reaches another concern only through a field it
// holds (embedded, so a pool's code still calls m.deleteSandbox: the type
// says whose it is); Manager embeds them all, so their RPCs are its
// methods.
// concerns_test.go pins the table of who holds whom, bounds Manager's own
// methods and lists the types that still hold the whole Manager. The split
// changed receivers, not code: method bodies still name their receiver m.
//
// Where each concern lives:
//
//   - The registry (type registry): manager.go (Options, the tables and
//     their lock, lookups, the one way records change: update/touch, which
//     persist and publish), watch.go (WatchSandboxes, publish),
//     reconcile.go (store and runtime brought to agree at start, on
//     Manager: it adopts into every concern).
//   - Sandboxes (type sandboxer): sandbox.go (create, get, list, delete,
//     suspend, extend), manager.go (endpoint, Route), boot.go (a boot and
//     its phase waterfall, until usable or failed), exits.go (exit
//     watcher, TTL reaper), limits.go (limits reached), network.go
//     (policy, exposed ports), view.go (view tickets), recording.go (the
//     recording RPCs and fork hook, delegated to
//     controld/internal/recording).
//   - Checkpoints (type checkpointer): checkpoint.go (create: freeze,
//     dump, commit), checkpoint_tree.go (get, list, delete; findCheckpoint
//     is the registry's lookup). verify.go (type verifier): the proofs a
//     fork is its checkpoint, on request and on every fresh replica. Moving
//     checkpoints in and out of the host is a type of its own over the
//     checkpointer, transfer: checkpoint_transfer.go (export and import as
//     OCI images), checkpoint_registry.go (push and pull through a
//     registry, the pull forks of one reference share).
//   - Forks (type forker): fork.go (ForkCheckpoint: N replicas, each a
//     restore verified against its checkpoint by the verifier).
//   - Pools (type pooler): pool.go (a pool's lifecycle and refill),
//     pool_claim.go (claims: hit, miss and the gate between them),
//     pool_session.go (frozen members and their held sessions),
//     pool_checkpoint.go (an image pool's own checkpoint, which its misses
//     fork from).
//   - Warm slots (type warmer): warmslots.go (precreated boots),
//     forkslots.go (precreated forks): the entry points creates and forks
//     take a slot through; each filler is a type of its own (warmSlots,
//     forkSlots) over the warmer.
//   - On Manager itself: New's wiring and Close (manager.go), reconcile.go,
//     telemetry (metrics.go, collector.go, host.go: GetHostStatus).
package fleet
