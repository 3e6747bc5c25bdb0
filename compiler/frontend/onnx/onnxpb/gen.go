// Package onnxpb holds the Go types of ONNX's protobuf schema
// (onnx.proto, the copy shipped with ONNX 1.12, IR version 8), generated
// by protoc and protoc-gen-go. Do not edit onnx.pb.go; regenerate it with
// go generate after replacing onnx.proto.
package onnxpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go_opt=Monnx.proto=github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb onnx.proto
