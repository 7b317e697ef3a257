package status

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// The operator's reset: POST <status.path>/reset?layer=<layer>&key=<key>,
// behind the status page's address rule (Serve), clears one key of
// one layer wherever this Traefik can reach it: its counter in memory (the
// memory store, or the Redis store's fallback), its entry in the block list of
// keys Redis reported over their limit, and its key in Redis. Support can so
// unlock a client without a restart or a flush.
//
// Other Traefik instances on the same Redis see the cleared Redis key at
// their next round trip; one that refused the key itself holds it in its
// own block list, and forgets it when the reset's message reaches it
// (../redisstore/resetsub.go): the reset script publishes it.

const resetSuffix = "/reset"

// serveReset answers a request for <status.path>/reset from an allowed client.
func serveReset(pg *Page, rw http.ResponseWriter, req *http.Request, now func() time.Time) {
	if req.Method != http.MethodPost {
		rw.Header()["Allow"] = []string{http.MethodPost}
		writeStatus(rw, req, http.StatusMethodNotAllowed, answer.JSONContentType, []byte(`{"error":"method not allowed"}`))

		return
	}

	body, code := resetKey(pg, req, now().UnixNano())
	writeStatus(rw, req, code, answer.JSONContentType, body)
}

// resetKey clears the key the query names at now and returns the answer:
// 200 when it cleared something, 404 when there was nothing to clear, 400
// naming a missing parameter or an unknown layer, and 503 when Redis could
// not be reached: the shared counter may still hold the key, so the operator
// should retry (memory and the block list are cleared all the same, and the
// body says so).
func resetKey(pg *Page, req *http.Request, now int64) ([]byte, int) {
	values := req.URL.Query()
	name, key := values.Get("layer"), values.Get("key")

	switch {
	case name == "":
		return badReset("missing query parameter layer", "layer")
	case key == "":
		return badReset("missing query parameter key", "key")
	}

	i := layerIndex(pg.Layers, name)
	if i < 0 {
		return badReset("unknown layer "+name, "layer")
	}

	r := ClearKey(pg, pg.Layers[i], key, now)
	pg.Events.Reset(r, operatorOf(pg, req))

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

// ClearKey clears key in layer l at now: in memory, in the block list and in
// Redis. A blockDuration block goes too: its memory entry beside the
// counter's, its Redis key in resetKeys.
func ClearKey(pg *Page, l *rule.Layer, key string, now int64) events.ResetReport {
	r := events.ResetReport{Layer: l.Name, Key: key}
	r.Memory = pg.Memory.Forget(l, key, now)
	if pg.Memory.ForgetBlock(l, key, now) {
		r.Memory = true
	}

	if rs := pg.Redis; rs != nil {
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
func operatorOf(pg *Page, req *http.Request) string {
	a, ok := request.ClientAddr(pg.IPs, req.RemoteAddr, req.Header["X-Forwarded-For"])
	if !ok {
		return request.UnknownClient
	}

	return a.String()
}
