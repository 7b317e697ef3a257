package yaegibench

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAHangUpMidStreamIsSettledUnderYaegi: the plugin as Traefik loads it
// (Yaegi), before httputil.ReverseProxy as Traefik's proxy. A stream states
// 50 then 250 tokens and its client hangs up: the proxy panics with
// http.ErrAbortHandler through the interpreted ServeHTTP, whose deferred
// settlement must run as the panic unwinds, and the panic must reach the
// server (Traefik needs it). The status page then shows nothing reserved
// and the 250 the stream stated.
func TestAHangUpMidStreamIsSettledUnderYaegi(t *testing.T) {
	gone := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		defer close(gone)
		rw.Header().Set("Content-Type", "text/event-stream")
		for _, tokens := range []int{50, 250} {
			_, _ = fmt.Fprintf(rw, "data: {\"usage\":{\"total_tokens\":%d}}\n\n", tokens)
			rw.(http.Flusher).Flush()
		}
		<-req.Context().Done()
	}))
	defer backend.Close()

	target, _ := url.Parse(backend.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorLog = log.New(io.Discard, "", 0)

	config := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "0"},
		"status": map[string]any{"path": "/_tierlimit"},
		"routes": []any{map[string]any{
			"name": "tokens", "paths": []any{"/v1/"}, "key": "header:X-Api-Key", "points": "1000", "duration": "1h",
			"costFrom": "json:usage.total_tokens", "reserve": "300",
		}},
	}
	plugin := buildWith(t, "tierlimit", config, "abort@yaegi", proxy)

	var recovered atomic.Value
	ended := make(chan struct{}, 1)
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/_tierlimit" {
			plugin.ServeHTTP(rw, req)
			return
		}

		defer func() {
			v := recover()
			recovered.Store(fmt.Sprint(v))
			ended <- struct{}{}
			if v != nil {
				panic(v)
			}
		}()
		plugin.ServeHTTP(rw, req)
	}))
	front.Config.ErrorLog = log.New(io.Discard, "", 0)
	front.Start()
	defer front.Close()

	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

	_, _ = io.WriteString(conn, "POST /v1/chat HTTP/1.1\r\nHost: x\r\nX-Api-Key: k1\r\nContent-Length: 0\r\n\r\n")

	br := bufio.NewReader(conn)
	var read strings.Builder
	for !strings.Contains(read.String(), "250}}") {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v (read %q)", err, read.String())
		}
		read.WriteString(line)
	}
	_ = conn.Close()

	select {
	case <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler did not end after the client hung up")
	}
	<-gone

	if v, _ := recovered.Load().(string); v != http.ErrAbortHandler.Error() {
		t.Errorf("the server saw %q, want the proxy's panic with http.ErrAbortHandler", v)
	}

	res, err := http.Get(front.URL + "/_tierlimit")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()

	for _, want := range []string{`"reserved":0`, `"settledPoints":250`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the status page lacks %s after the hang-up:\n%s", want, body)
		}
	}
}
