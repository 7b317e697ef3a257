// Command authserver is the example ForwardAuth server of docker-compose.yml:
// "Bearer user-<id>" is a user, "Bearer svc-<id>" a service account, no token
// is anonymous, anything else is 401. Not for production.
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit/e2e/fakeauth"
)

func main() {
	addr := flag.String("addr", ":9000", "listen address")
	flag.Parse()

	mux := http.NewServeMux()
	mux.Handle("/auth", fakeauth.Handler())

	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("fake ForwardAuth server on %s/auth", *addr)
	log.Fatal(srv.ListenAndServe())
}
