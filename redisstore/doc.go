// Package redisstore is the Redis store: counters in Redis shared by every
// Traefik process (RedisStore), one script call deciding a request's layers
// (Take, Refund and Record, store.go; TakeScript and refundScript and their
// encoding, scripts.go; a Cluster's slot groups, cluster.go; calendar
// windows, calendar.go), or counters that admit from leases of Redis's
// points (redis.syncInterval, syncstore.go; the lease script and its
// calls, lease.go). It owns what happens when Redis fails: the backend's
// back-off and its event lines (RedisBackend, backend.go), the memory
// fallback started from what Redis last reported (fallback.go), what the
// fallback charged during an outage and pays back (owed.go), the probe
// that finds Redis again, a write as a request makes (probe.go), and the
// one-word reason of a failure (reason.go). It keeps the keys Redis reported over
// their limit (BlockList, blocklist.go) and resets them: an operator's reset (reset.go),
// published to the other replicas (resetsub.go).
//
// It takes a rule.Charge and writes a rule.Tally, never an *http.Request;
// it imports memstore (the fallback), rule, limit, events, lifetime and
// redisresp, never the root, and names their constants through aliases
// (aliases.go; ../doc.go: qualified names).
package redisstore
