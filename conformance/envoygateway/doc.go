// Package envoygateway is a conformance test of ratelimitd against the
// real Envoy Gateway v1.9.1 control plane (make test-eg; see
// CONTRIBUTING.md, "The Envoy Gateway conformance test"). It is a module
// of its own so that Envoy Gateway's tooling stays out of ratelimitd's
// go.mod, and its test runs only when RATELIMITD_EG_BIN names an
// envoy-gateway binary.
package envoygateway
