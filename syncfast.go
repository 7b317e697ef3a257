package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/redisstore"
)

// syncedPath is the handler of a modeRedis instance with redis.syncInterval
// (syncstore.go): the anonymous path, decided on the synced counters under
// their lock, as anonymousPath decides on the memory store's windows. A
// plan here is global and at most one more layer (TestFastPlansHoldTwoLayers),
// so a refusal gives back at most the one charge before it. A window's first
// refusal, a configured body and a WebSocket upgrade take syncTake and
// answer, which report and build the refusal; later refusals reuse the
// layer's refusal cache (under the synced counters' lock: this instance
// charges no memory window and keeps no block list).
type syncedPath Plugin

// Its ServeHTTP and refuseSynced are in paths.tmpl.

// serveSyncedSlow decides a request of syncedPath on syncTake, and answers
// it: a window's first refusal, a configured body, a WebSocket upgrade
// (refuseSynced).
func serveSyncedSlow(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64) {
	var t tally

	c := chargeOf(layers, client, "", req, now, false)
	redisstore.SyncTake(p.fast.store.Synced, &t, c)
	answerRedis(p, rw, req, &t, c)
}
