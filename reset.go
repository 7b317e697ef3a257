package tierlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tierlimit/tierlimit/events"
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/redisresp"
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
// (resetsub.go): the reset script publishes it.

const resetSuffix = "/reset"

// What resetReport.Redis says of the key in Redis.
const (
	redisCleared     = "cleared"
	redisAbsent      = "absent"
	redisUnavailable = "unavailable"
)

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
	case r.Redis == redisUnavailable:
		code = http.StatusServiceUnavailable
		r.Error = "redis unavailable: the key may still be counted there"
	case !r.Memory && !r.BlockList && r.Redis != redisCleared:
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
func clearKey(p *Plugin, l *layer, key string) resetReport {
	now := p.now().UnixNano()
	r := resetReport{Layer: l.Name, Key: key}
	r.Memory = p.memory.Forget(l, key, now)
	if p.memory.ForgetBlock(l, key, now) {
		r.Memory = true
	}

	if rs := redisOf(p.store); rs != nil {
		if rs.synced != nil && syncForget(rs.synced, l.Name, key) {
			r.Memory = true
		}

		r.BlockList = rs.blocked.forget(l.BlockPrefix+key, now)
		r.Redis = rs.reset(l, key, now)
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

// forget drops a block list entry (layer.blockPrefix + key) and reports
// whether it still refused.
func (b *blockList) forget(id string, now int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()

	reset, ok := b.until[id]
	if !ok {
		return false
	}

	delete(b.until, id)
	b.size.Store(int64(len(b.until)))

	return reset > now
}

// resetScript deletes its keys, publishes the reset to the other replicas
// (ARGV[1] the channel, ARGV[2] the message: resetsub.go) and returns how
// many keys there were, as a one-integer array (the replies redisresp
// reads). A script rather than a DEL, so that it goes through the calls the
// store makes already (EVALSHA, NOSCRIPT, a cluster's slots and
// redirections), and the PUBLISH costs no round trip of its own; on a
// cluster, a PUBLISH reaches the subscribers of every node. The message is
// sent whatever was deleted: a replica's block list entry may outlive the
// key by a few milliseconds.
const resetScript = `
local n = 0
for i = 1, #KEYS do
  n = n + redis.call('DEL', KEYS[i])
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return {n}
`

var resetRedis = redisresp.NewScript(resetScript)

// resetKeys are the Redis keys of key in layer l: its counter, in the form of
// the deployment (clusterKey on a cluster), and a blockDuration block's key,
// under the same hash tag: resetScript deletes every key of one call, which
// a cluster runs in one slot.
func resetKeys(s *redisStore, l *layer, key string, now int64) []string {
	if s.synced != nil {
		start, _ := syncWindow(l, now)
		return []string{syncKey(l, key, s.backend.cluster != nil, start)}
	}

	k := l.RedisKey + key
	if s.backend.cluster != nil {
		k = resetClusterKey(l, key)
	}

	if l.Calendar != 0 {
		k += calendarSuffix(l, now)
	}

	if l.BlockDuration != 0 {
		return []string{k, k + ":block"}
	}

	return []string{k}
}

// resetClusterKey is clusterKey for a bucket key as keyFor made it: a
// principal-keyed route's key of a request without a principal (ip:<addr>)
// is tagged by the address, every other by the whole key.
func resetClusterKey(l *layer, key string) string {
	return clusterKey(l, key)
}

// reset deletes key's Redis keys in l and says what it found: redisCleared,
// redisAbsent, or redisUnavailable when the call failed (logged; Redis's
// back-off is left to the requests, which will find out themselves).
func (s *redisStore) reset(l *layer, key string, now int64) string {
	n, err := s.deleteKeys(resetKeys(s, l, key, now), s.channel, resetMessage(s.name, l.Name, key))
	if err != nil {
		s.backend.logResetFailure(err)
		return redisUnavailable
	}

	if n > 0 {
		return redisCleared
	}

	return redisAbsent
}

var errNoReply = errors.New("no reply")

// deleteKeys runs resetScript on keys, which share a slot, publishing
// message on channel, and returns how many existed.
func (s *redisStore) deleteKeys(keys []string, channel, message string) (int64, error) {
	encoded := ""
	for _, k := range keys {
		encoded += redisresp.Bulk(k)
	}

	encoded += redisresp.Bulk(channel) + redisresp.Bulk(message)
	call := resetRedis.Call(len(keys), len(keys)+2)

	var ints []int64
	var serverErr string
	var err error

	if cl := s.backend.cluster; cl != nil {
		var replies []redisresp.Reply

		replies, err = cl.RunInts([]redisresp.ClusterCall{{Slot: redisresp.Slot(keys[0]), Call: call, Encoded: encoded}})
		if err == nil && len(replies) == 1 {
			ints = replies[0].Ints
			serverErr = replies[0].ServerErr
		}
	} else {
		ints, serverErr, err = call.RunIntsOn(s.backend.pool, encoded)
	}

	switch {
	case err != nil:
		return 0, fmt.Errorf("deleting %s: %w", keys[0], err)
	case serverErr != "":
		return 0, fmt.Errorf("deleting %s: %s", keys[0], serverErr)
	case len(ints) != 1:
		return 0, fmt.Errorf("deleting %s: %w", keys[0], errNoReply)
	}

	return ints[0], nil
}

// logResetFailure logs a reset that could not reach Redis.
func (b *redisBackend) logResetFailure(err error) {
	line, jerr := events.RedisEventLine(redisEvent{Event: "REDIS_RESET_FAILED", Severity: "error", Address: b.address, Error: err.Error()}, time.Now().UnixNano())
	if jerr == nil {
		_, _ = b.log.Write(line)
	}
}
