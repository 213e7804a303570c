// Package marblepb is the wire format of the Marble API: the gRPC service
// through which a Marble asks the Coordinator to activate it. It is
// wire-compatible with MarbleRun's: the full method name is
// /rpc.Marble/Activate and the messages have MarbleRun's field numbers and
// types.
//
// marble.proto is the source; marble.pb.go and marble_grpc.pb.go are generated
// from it by protoc and the plugins whose versions go.mod pins in its tool
// block. After editing marble.proto (or changing those versions), run
// `go generate ./api/marblepb`; a test fails while the committed code is stale.
//
// The protobuf package has to be "rpc", because the method name is made from
// it, so the messages' full names (rpc.ActivationReq, ...) are the same as
// those of MarbleRun's own generated package: one binary cannot link both, as
// the protobuf registry rejects a full name registered twice.
package marblepb

//go:generate go run ./internal/protogen
