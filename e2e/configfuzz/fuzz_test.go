package configfuzz

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
)

// FuzzNewNeverPanics: any configuration Traefik can decode makes New return
// a middleware or an error, never a panic (which would make Traefik drop
// every router); and New's errors are all configuration errors: a panic New
// recovered (its last line of defence) fails here too. A middleware that New
// returns serves a request without panicking. The corpus
// (testdata/fuzz/FuzzNewNeverPanics) is replayed through Traefik's own loader by
// configdecode's TestFuzzCorpusThroughTraefik.
func FuzzNewNeverPanics(f *testing.F) {
	f.Fuzz(func(t *testing.T, base, ops []byte) {
		m := Config(base, ops)

		cfg, err := Decode(m)
		if err != nil {
			return // Traefik refuses it before New
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		h, err := tierlimit.New(ctx, http.NotFoundHandler(), cfg, "fuzz@file")
		if err != nil {
			if !errors.Is(err, config.ErrConfig) {
				t.Fatalf("New: %v\nconfiguration: %#v", err, m)
			}

			return
		}

		if cfg.Store == "memory" {
			serve(t, h, m)
		}
	})
}

// serve sends h one request of a principal on a plan with credentials.
func serve(t *testing.T, h http.Handler, m map[string]any) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("serving a request: panic: %v\nconfiguration: %#v", r, m)
		}
	}()

	req := httptest.NewRequest(http.MethodPost, "/a?access_token=x", nil)
	req.RemoteAddr = "10.0.0.1:1234"
	for k, v := range map[string]string{
		"X-Auth-User": "ann", "X-Auth-Plan": "free", "X-Api-Key": "k", "Authorization": "Bearer x", "X-Forwarded-For": "203.0.113.9",
	} {
		req.Header.Set(k, v)
	}

	h.ServeHTTP(httptest.NewRecorder(), req)
}
