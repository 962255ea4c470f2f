// Package aci is the Go client of the Agent-Computer Interface: one
// WebSocket session to a sandbox's guestd (directly over its unix socket, or
// through controld's gateway), carrying pipelined typed requests (input
// steps, screenshots, windows, clipboard, exec, files) and pushed events.
//
//	s, err := aci.Dial(ctx, endpoint.Url, endpoint.Token)
//	...
//	defer s.Close()
//	r, err := s.Step(ctx, []*aciv1.Action{aci.Click(10, 20), aci.Type("hi")}, aci.PNG())
//
// Errors from the server are *Error values that match this package's
// sentinels and the api/errdefs classes with errors.Is. A FrameCache shared
// by the sessions of a forked fleet turns repeated identical screens into
// small not_modified replies.
//
// The package never imports gRPC server code: guestd links it.
package aci
