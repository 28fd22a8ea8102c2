// Package api is the wire contract between nodemon, gpuctl serve and
// gpuctl clients: protobuf messages, their framing on a stream, and the
// protocol version.
package api

//go:generate protoc --plugin=protoc-gen-go=../bin/protoc-gen-go --go_out=. --go_opt=paths=source_relative gpuctl.proto
