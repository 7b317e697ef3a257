// Command authserver is the example ForwardAuth server of docker-compose.yml and
// examples/kubernetes: "Bearer user-<id>" is a user, "Bearer user-<id>@<plan>" a
// user on a plan (X-Auth-Plan), "Bearer svc-<id>" a service account, any other
// Bearer token is 401, anything else a guest (200 without a principal). Not for
// production.
//
// `authserver -healthcheck` asks a running server's /healthz and exits 0 when it
// answers 200: the container image has no shell or curl for a healthcheck.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/tierlimit/tierlimit/e2e/fakeauth"
)

func main() {
	addr := flag.String("addr", ":9000", "listen address")
	healthcheck := flag.Bool("healthcheck", false, "ask the server listening on -addr for /healthz, exit 0 if healthy")
	flag.Parse()

	if *healthcheck {
		if err := check(*addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}

		return
	}

	srv := &http.Server{Addr: *addr, Handler: handler(), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("example ForwardAuth server on %s/auth", *addr)
	log.Fatal(srv.ListenAndServe())
}

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/auth", fakeauth.Handler())
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })

	return mux
}

// check asks the server listening on addr (":9000" means this host) for /healthz.
func check(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("reading -addr %q: %w", addr, err)
	}

	if host == "" {
		host = "127.0.0.1"
	}

	client := &http.Client{Timeout: 2 * time.Second}

	resp, err := client.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		return fmt.Errorf("asking /healthz: %w", err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("asking /healthz: status %d", resp.StatusCode)
	}

	return nil
}
