// Package status is the status endpoint (status.path): for clients whose
// resolved IP is in status.allowedIPs, GET/HEAD <path> answers JSON (the
// layers, their counters since the process started, the live keys; page.go
// and keys.go), <path>/metrics the Prometheus text format (metrics.go), and
// POST <path>/reset clears one key of one layer (reset.go). Every other
// request, including those paths from any other client, is an ordinary
// request: the root asks Serve only for paths that start with status.path,
// and a status request is charged to no layer.
//
// The root hands an instance over as a Page, plain data built once in New:
// its layers, stores, registries and what its costFrom routes reserve. This
// package reads them and never imports the root. It is off the request path,
// so it may call methods and take the memory store's lock, and it names
// other packages' types qualified (../doc.go: qualified names).
package status
