// Package network is controld's sandbox networking: the network namespace
// of every sandbox, made by runc (a boot) or CRIU (a restore) inside the
// sandbox's user namespace and finished by the network hook runc runs
// before any process of the sandbox does (Attach, forkfleet-nethook), and
// for the egress mode a per-sandbox router namespace, its uplink to the
// host, NAT, a DNS stub and the sandbox's policy in the host's nftables
// table, prepared by controld beforehand (Setup).
//
// Layout (mode egress; none has only the first namespace, with lo up):
//
//	sandbox netns  <RunDir>/ns/<id>       lo, eth0 10.201.0.2/30 via 10.201.0.1
//	   | veth
//	router netns   <RunDir>/ns/<id>.rt    sb 10.201.0.1/30 (DNS stub :53),
//	   |                                  up <uplink>.2/30, masquerade on up
//	   | veth
//	host           <IfPrefix><n>          <uplink>.1/30; table inet <Table>
//
// Every sandbox sees the same in-sandbox address, routes and resolver, so a
// fork restored from a checkpoint keeps its sockets and configuration valid;
// each one's router namespace gives it its own outside address (uplink n),
// the per-sandbox router pattern of Firecracker-based systems. The host's
// table drops traffic from sandboxes to the host itself (input), to other
// sandboxes, link-local and multicast addresses, and applies each sandbox's
// policy (forward); controld answers DNS for the sandbox from a socket it
// owns in the router namespace and forwards the queries to the host's
// resolver. State that must survive a controld restart lives in RunDir
// (namespace bind mounts, the sandbox's made by the hook, one JSON file per
// sandbox) and in the table;
// Prune removes what no live sandbox owns.
package network
