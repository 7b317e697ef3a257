// Package sdk runs LLM gateways in the real Traefik, called by the official
// OpenAI and Anthropic Go SDKs, against a fake API (fakellm). It is a module of
// its own because the SDKs' requirements (Go 1.26 and newer versions of modules
// Traefik depends on) would raise versions in the e2e module, which builds the
// Traefik binary with its own pinned dependencies; the harness still builds
// Traefik from the e2e module's directory (harness.TraefikBinary).
package sdk
