// Package payments is the root of the payments service module. It holds what
// belongs to the service as a whole rather than to one of its packages: the
// OpenAPI description of its HTTP API.
package payments

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of the HTTP API (openapi.yaml at the
// root of the module), embedded into the binary so that the service can serve it
// at /openapi.yaml. Treat it as read-only.
//
//go:embed openapi.yaml
var OpenAPI []byte
