package e2e

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

const wsDynamic = `
http:
  routers:
    ws:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ws]
      service: backend
  middlewares:
    ws:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: {{points}}, duration: 60s}
          websocket:
            maxConnectionsPerIP: {{cap}}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func wsConfig(points, maxConns int) string {
	return strings.NewReplacer("{{points}}", strconv.Itoa(points), "{{cap}}", strconv.Itoa(maxConns)).Replace(wsDynamic)
}

func (e *env) dialWS(ctx context.Context, client string) (*websocket.Conn, *http.Response, error) {
	url := "ws" + strings.TrimPrefix(e.traefik.Web, "http") + "/ws"

	return websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader: http.Header{"X-Forwarded-For": []string{client}},
	})
}

// echo writes and reads one message.
func echo(ctx context.Context, c *websocket.Conn, msg string) error {
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return err
	}

	_, got, err := c.Read(ctx)
	if err != nil {
		return err
	}

	if string(got) != msg {
		return errors.New("echoed " + string(got))
	}

	return nil
}

// refusedWith1013 dials and expects the plugin's handshake and a 1013 close.
func (e *env) refusedWith1013(ctx context.Context, client string) {
	e.t.Helper()

	c, _, err := e.dialWS(ctx, client)
	if err != nil {
		e.t.Fatalf("a refused upgrade must still complete the handshake: %v", err)
	}
	defer c.CloseNow()

	_, _, err = c.Read(ctx)
	if status := websocket.CloseStatus(err); status != websocket.StatusTryAgainLater {
		e.t.Fatalf("close status %d (%v), want 1013", status, err)
	}
}

func TestWebSocketUpgradesOnTheSameCounters(t *testing.T) {
	e := start(t, wsConfig(3, 0))
	e.waitRouters("ws")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for i := 1; i <= 3; i++ {
		c, resp, err := e.dialWS(ctx, "198.51.100.1")
		if err != nil {
			t.Fatalf("upgrade %d: %v", i, err)
		}

		if resp.Header.Get("X-RateLimit-Limit") != "3" || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(3-i) {
			t.Fatalf("101 of upgrade %d without the rate-limit headers: %v", i, resp.Header)
		}

		if err := echo(ctx, c, "hello "+strconv.Itoa(i)); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}

		c.Close(websocket.StatusNormalClosure, "")
	}

	e.refusedWith1013(ctx, "198.51.100.1")

	// A plain request from the same client is refused the usual way.
	checkRefusal(t, e.get(e.traefik.Web+"/api", from("198.51.100.1")), "ip", 3)
}

func TestWebSocketConnectionCap(t *testing.T) {
	e := start(t, wsConfig(100000, 3))
	e.waitRouters("ws")

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var open []*websocket.Conn

	for i := 0; i < 3; i++ {
		c, _, err := e.dialWS(ctx, "198.51.100.1")
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}

		if err := echo(ctx, c, "x"); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}

		open = append(open, c)
	}

	e.refusedWith1013(ctx, "198.51.100.1")

	// Another IP is unaffected.
	other, _, err := e.dialWS(ctx, "198.51.100.2")
	if err != nil || echo(ctx, other, "y") != nil {
		t.Fatalf("other IP: %v", err)
	}

	other.Close(websocket.StatusNormalClosure, "")

	// One of the three closes: a new one is accepted (the proxy notices the
	// close on its own goroutine, so allow it a few attempts).
	open[0].Close(websocket.StatusNormalClosure, "")
	open[0] = e.dialUntilAccepted(ctx, "198.51.100.1")

	for _, c := range open {
		c.CloseNow()
	}

	// 1000 abrupt disconnects (no close handshake) leave nothing counted: the
	// cap still admits three at once afterwards.
	for i := 0; i < 1000; i++ {
		c := e.dialUntilAccepted(ctx, "198.51.100.3")
		c.CloseNow()
	}

	var again []*websocket.Conn
	for i := 0; i < 3; i++ {
		again = append(again, e.dialUntilAccepted(ctx, "198.51.100.3"))
	}

	e.refusedWith1013(ctx, "198.51.100.3")

	for _, c := range again {
		c.CloseNow()
	}
}

// dialUntilAccepted dials until the plugin admits the connection: slots freed
// by closed connections are released when Traefik's proxy sees the close.
func (e *env) dialUntilAccepted(ctx context.Context, client string) *websocket.Conn {
	e.t.Helper()

	for attempt := 0; ; attempt++ {
		c, _, err := e.dialWS(ctx, client)
		if err != nil {
			e.t.Fatalf("dial: %v", err)
		}

		if err := echo(ctx, c, "ping"); err == nil {
			return c
		} else if websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
			e.t.Fatalf("echo: %v", err)
		}

		c.CloseNow()

		if attempt == 200 {
			e.t.Fatal("a slot was never released")
		}

		time.Sleep(5 * time.Millisecond) // let the proxy notice the earlier close; not an assertion
	}
}
