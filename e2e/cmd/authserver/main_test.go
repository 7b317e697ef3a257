package main

import (
	"net"
	"net/http/httptest"
	"testing"
)

// TestHealthcheck: the check docker-compose.yml runs passes against a serving
// authserver and fails when nothing listens.
func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(handler())
	defer srv.Close()

	if err := check(srv.Listener.Addr().String()); err != nil {
		t.Fatalf("healthy server: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	closed := l.Addr().String()
	l.Close()

	if err := check(closed); err == nil {
		t.Fatal("no server: the check passed")
	}
}
