// Package examplecheck holds the tests that the deployment examples work as
// written: docker-compose.yml as Docker Compose loads it, the auth server's
// image build, and examples/kubernetes as the API server and Traefik's CRD
// provider decode it. Docker and Kubernetes are not run: the tests use the
// libraries those tools use.
package examplecheck
