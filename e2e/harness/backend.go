package harness

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// BackendHandler answers 200 with the method, path and X-Forwarded-For it received, and 404 under /missing,
// so tests can check that headers survive a downstream error.
func BackendHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/missing") {
			http.NotFound(rw, req)
			return
		}

		rw.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(rw, "ok %s %s\nX-Forwarded-For: %s\n", req.Method, req.URL.Path, req.Header.Get("X-Forwarded-For"))
	})
}

// ServeBackend serves BackendHandler on addr ("127.0.0.1:0" for any port) and
// returns its base URL and a function that stops it.
func ServeBackend(addr string) (string, func(), error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listening for the backend on %s: %w", addr, err)
	}

	srv := &http.Server{Handler: BackendHandler()}
	go func() { _ = srv.Serve(l) }()

	return "http://" + l.Addr().String(), func() { _ = srv.Close() }, nil
}
