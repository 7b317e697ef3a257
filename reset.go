package tierlimit

import (
	"encoding/json"
	"net/http"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
)

// The operator's reset: POST <status.path>/reset?layer=<layer>&key=<key>,
// behind the status page's address rule (serveStatusPage), clears one key of
// one layer wherever this Traefik can reach it: its counter in memory (the
// memory store, or the Redis store's fallback), its entry in the block list of
// keys Redis reported over their limit, and its key in Redis. Support can so
// unlock a client without a restart or a flush. It is off the request path:
// it may call methods and take the store's lock like the status page.
//
// Other Traefik instances on the same Redis see the cleared Redis key at
// their next round trip; one that refused the key itself holds it in its
// own block list, and forgets it when the reset's message reaches it
// (redisstore/resetsub.go): the reset script publishes it.

const resetSuffix = "/reset"

// serveReset answers a request for <status.path>/reset from an allowed client.
func serveReset(p *Plugin, rw http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		rw.Header()["Allow"] = []string{http.MethodPost}
		writeStatus(rw, req, http.StatusMethodNotAllowed, answer.JSONContentType, []byte(`{"error":"method not allowed"}`))

		return
	}

	body, code := resetKey(p, req)
	writeStatus(rw, req, code, answer.JSONContentType, body)
}

// resetKey clears the key the query names and returns the answer: 200 when it
// cleared something, 404 when there was nothing to clear, 400 naming a
// missing parameter or an unknown layer, and 503 when Redis could not be
// reached: the shared counter may still hold the key, so the operator should
// retry (memory and the block list are cleared all the same, and the body
// says so).
func resetKey(p *Plugin, req *http.Request) ([]byte, int) {
	values := req.URL.Query()
	name, key := values.Get("layer"), values.Get("key")

	switch {
	case name == "":
		return badReset("missing query parameter layer", "layer")
	case key == "":
		return badReset("missing query parameter key", "key")
	}

	i := p.layerIndex(name)
	if i < 0 {
		return badReset("unknown layer "+name, "layer")
	}

	r := clearKey(p, p.layers[i], key)
	p.events.Reset(r, operatorOf(p, req))

	code := http.StatusOK

	switch {
	case r.Redis == redisstore.RedisUnavailable:
		code = http.StatusServiceUnavailable
		r.Error = "redis unavailable: the key may still be counted there"
	case !r.Memory && !r.BlockList && r.Redis != redisstore.RedisCleared:
		code = http.StatusNotFound
		r.Error = "nothing to reset"
	}

	body, err := json.Marshal(r)
	if err != nil {
		return []byte(`{"error":"encoding the reset"}`), http.StatusInternalServerError
	}

	return body, code
}

func badReset(msg, parameter string) ([]byte, int) {
	body, _ := json.Marshal(statusError{Error: msg, Parameter: parameter})
	return body, http.StatusBadRequest
}

// clearKey clears key in layer l: in memory, in the block list and in Redis.
// A blockDuration block goes too: its memory entry beside the counter's, its
// Redis key in resetKeys.
func clearKey(p *Plugin, l *layer, key string) events.ResetReport {
	now := p.now().UnixNano()
	r := events.ResetReport{Layer: l.Name, Key: key}
	r.Memory = p.memory.Forget(l, key, now)
	if p.memory.ForgetBlock(l, key, now) {
		r.Memory = true
	}

	if rs := p.stores.redis; rs != nil {
		if rs.Synced != nil && redisstore.SyncForget(rs.Synced, l.Name, key) {
			r.Memory = true
		}

		r.BlockList = rs.Blocked.Forget(l.BlockPrefix+key, now)
		r.Redis = rs.Reset(l, key, now)
	}

	return r
}

// operatorOf is the address of the reset's client, resolved as the status
// page's address rule resolves it.
func operatorOf(p *Plugin, req *http.Request) string {
	a, ok := request.ClientAddr(p.ips, req.RemoteAddr, req.Header["X-Forwarded-For"])
	if !ok {
		return request.UnknownClient
	}

	return a.String()
}
