module github.com/forkfleet/forkfleet/guestd

go 1.26.6

require (
	github.com/coder/websocket v1.8.15
	github.com/forkfleet/forkfleet/api v0.0.0
	github.com/godbus/dbus/v5 v5.1.0
	github.com/jezek/xgb v1.1.1
	github.com/klauspost/compress v1.20.4
	github.com/zeebo/xxh3 v1.1.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.50.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/grpc v1.85.0 // indirect
)

replace github.com/forkfleet/forkfleet/api => ../api
