// Package client is the Go client of the payments API, with retries made safe
// by default.
//
// The request and response types (types.gen.go) are generated from
// openapi.yaml by oapi-codegen, types only; a thin hand-written layer does
// the HTTP and the retries.
package client

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml -o types.gen.go ../openapi.yaml
