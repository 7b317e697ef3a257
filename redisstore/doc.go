// Package redisstore is the Redis store: counters in Redis shared by every
// Traefik process (RedisStore), one script call deciding a request's layers
// (TakeScript, refundScript and the CounterStore both stores implement,
// redisstore.go; a Cluster's slot groups, redisstore_cluster.go; calendar
// windows, calendar.go), or counters synced in batches (redis.syncInterval,
// syncstore.go). It owns what happens when Redis fails: the backend's
// back-off and its event lines (RedisBackend, redisstore.go), the memory
// fallback started from what Redis last reported (fallback.go), what the
// fallback charged during an outage and pays back (owed.go), and the probe
// that finds Redis again (probe.go). It keeps the keys Redis reported over
// their limit (BlockList) and resets them: an operator's reset (reset.go),
// published to the other replicas (resetsub.go).
//
// It takes a rule.Charge and writes a rule.Tally, never an *http.Request;
// it imports memstore (the fallback), rule, limit, events, lifetime and
// redisresp, never the root, and names their types through aliases
// (aliases.go; ../doc.go: qualified names).
package redisstore
