module github.com/forkfleet/forkfleet/benchd

go 1.26.0

require github.com/forkfleet/forkfleet/api v0.0.0

replace github.com/forkfleet/forkfleet/api => ../api
