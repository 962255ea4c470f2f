module github.com/forkfleet/forkfleet/guestd

go 1.26.0

require github.com/forkfleet/forkfleet/api v0.0.0

require (
	github.com/coder/websocket v1.8.15 // indirect
	github.com/jezek/xgb v1.1.1 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/forkfleet/forkfleet/api => ../api
