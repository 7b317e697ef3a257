// Package dashboard tests examples/grafana against the metrics the plugin
// exports. It is a module of its own because the Prometheus module's
// requirements would raise versions of modules the Traefik binary that the e2e
// module builds is pinned to (consul, nomad, zookeeper, mongo clients).
package dashboard
