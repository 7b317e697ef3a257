package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// leaseScript settles and grants synced counters' leases (syncstore.go),
// one key after the other, each atomically.
//
// KEYS: the keys. ARGV, six per key: the points to add (admitted without a
// lease), the lease given back, the points needed now, the points wanted,
// the key's TTL in milliseconds (to its window's end on the caller's clock,
// and KeyGrace; a key keeps a longer TTL that another replica gave it) and
// the layer's points. The key's count becomes count + add - back (at least
// 0), then grows by the grant, which is limit.LeaseGrant: the larger of the need and a quarter of what is left (at
// most the want and what is left), nothing when what is left cannot cover
// the need. A key of another kind, or holding something that is not an
// integer, is started afresh. Returns grant and count per key, in order.
var leaseScript = `
local out = {}
for i = 1, #KEYS do
  local k, j = KEYS[i], 6 * (i - 1)
  local add, back = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local need, want = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local ttl, points = tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6])
  local c = redis.pcall('GET', k)
  local had = type(c) == 'string'
  local count = 0
  if had then count = tonumber(c) or 0 end
  local n = count + add - back
  if n < 0 then n = 0 end
  local left, grant = points - n, 0
  if left > 0 and left >= need and want > 0 then
    grant = math.floor((left + ` + strconv.Itoa(limit.LeaseShareDiv-1) + `) / ` + strconv.Itoa(limit.LeaseShareDiv) + `)
    if grant < need then grant = need end
    if grant > want then grant = want end
    if grant > left then grant = left end
  end
  n = n + grant
  if n ~= count or (not had and n > 0) then
    -- never shorter: a replica whose clock is ahead ends the window early
    local pttl = redis.call('PTTL', k)
    if pttl > ttl then ttl = pttl end
    redis.call('SET', k, n, 'PX', ttl)
  end
  out[2 * i - 1] = grant
  out[2 * i] = n
end
return out
`

var leaseRedis = redisresp.NewScript(leaseScript)

// SyncCounter is one key of one window as a replica knows it: Redis's total
// at its last answer, the lease this replica holds, and what it admitted
// without a lease. It is declared here, in the first file Yaegi reads
// that names it, because the root's synced path names it (../doc.go:
// qualified names).
type SyncCounter struct {
	Key    string // the Redis key, naming the window's start
	layer  string // the layer's name and the bucket key, for resets
	bucket string
	slot   int // the key's Cluster slot
	// Remote is Redis's count at its last answer: every point it granted
	// (this replica's lease included) and every pending point paid.
	Remote int64
	// Lease is the points this replica holds and has not spent.
	Lease int64
	// Pending is what this replica admitted without a lease (Redis down),
	// to be added to Redis; Inflight is the part a call is sending.
	Pending  int64
	Inflight int64
	Back     int64 // lease a call is giving back
	Need     int64 // points queued for the next lease call (0: not queued)
	points   int64 // the layer's points at the last request
	End      int64 // the window's end, Unix nanoseconds
	// allowed and refused count decisions under the state's lock, added to
	// stats at each sync: an atomic add on the request path costs more.
	// Allowed since the last sync is also the key's use, which sizes its
	// next top-up.
	Allowed  int64
	Refused  int64
	stats    *rule.Stats
	ResetH   []string // X-RateLimit-Reset of the window
	ResetSec int64    // its second
	Logged   bool     // a refusal of this window was reported
	// Full: a request was refused for want of room (and reported), and no
	// answer of Redis since gave room: the next is refused from the cache.
	Full    bool
	Touched bool  // a request asked since the last sync
	Idle    int64 // syncs in a row that no request asked in
}

// LeaseAsk is what one counter sends in a lease call: add pending points,
// give back a lease, and need and want points of the layer's points, as
// they were when the call was collected under the state's lock (the call
// runs without it).
type LeaseAsk struct {
	c                             *SyncCounter
	add, back, need, want, points int64
}

// applyAsks applies a lease call's replies (grant and count per ask) to
// the counters. Called with st.mu held.
func applyAsks(asks []LeaseAsk, replies []int64) {
	for i, a := range asks {
		c := a.c
		c.Lease += replies[2*i]
		c.Remote = replies[2*i+1]
		c.Inflight -= a.add
		c.Back -= a.back
		c.Full = c.Full && limit.Full(Counted(c), c.points)
	}
}

// unsendAsks puts what a lease call that did not happen was sending back
// on its counters: pending points pending again, leases held again.
// Called with st.mu held.
func unsendAsks(asks []LeaseAsk) {
	for _, a := range asks {
		c := a.c
		c.Inflight -= a.add
		c.Pending += a.add
		c.Back -= a.back
		c.Lease += a.back
		c.Full = c.Full && a.back == 0
	}
}

// SendLeases runs leaseScript for asks: chunks of syncBatch keys, one call
// each, or on a Cluster one call per slot, sent together. It returns grant
// and count per ask, in asks' order.
func SendLeases(b *RedisBackend, asks []LeaseAsk, now int64) ([]int64, error) {
	var calls []redisresp.ClusterCall
	var bounds []int

	for i := 0; i < len(asks); {
		j := i + 1
		for j < len(asks) && j-i < syncBatch && (b.cluster == nil || asks[j].c.slot == asks[i].c.slot) {
			j++
		}

		calls = append(calls, redisresp.ClusterCall{Slot: asks[i].c.slot, Call: leaseRedis.Call(j-i, 7*(j-i)), Encoded: encodeLeases(asks[i:j], now)})
		bounds = append(bounds, i)
		i = j
	}

	replies := make([]int64, 0, 2*len(asks))

	if b.cluster != nil {
		rs, err := b.cluster.RunInts(calls)
		if err != nil {
			return nil, fmt.Errorf("leasing synced counters: %w", err)
		}

		for k, r := range rs {
			if err := checkLeaseReply(r.Ints, r.ServerErr, nil, len(asks), bounds, k); err != nil {
				return nil, err
			}

			replies = append(replies, r.Ints...)
		}

		return replies, nil
	}

	for k, call := range calls {
		ints, serverErr, err := call.Call.RunIntsOn(b.Pool, call.Encoded)
		if err := checkLeaseReply(ints, serverErr, err, len(asks), bounds, k); err != nil {
			return nil, err
		}

		replies = append(replies, ints...)
	}

	return replies, nil
}

// checkLeaseReply checks the reply of call k: grant and count per key
// sent, none negative.
func checkLeaseReply(ints []int64, serverErr string, err error, n int, bounds []int, k int) error {
	if err != nil {
		return fmt.Errorf("leasing synced counters: %w", err)
	}

	if serverErr != "" {
		return fmt.Errorf("running the lease script: %s", serverErr)
	}

	end := n
	if k+1 < len(bounds) {
		end = bounds[k+1]
	}

	if len(ints) != 2*(end-bounds[k]) {
		return fmt.Errorf("%w: %d integers for %d keys", ErrBadReply, len(ints), end-bounds[k])
	}

	for _, v := range ints {
		if v < 0 {
			return fmt.Errorf("%w: a negative grant or count, %d", ErrBadReply, v)
		}
	}

	return nil
}

// encodeLeases encodes leaseScript's keys and arguments for asks.
func encodeLeases(asks []LeaseAsk, now int64) string {
	keys, args := "", ""

	for _, a := range asks {
		ttl := (a.c.End - now + int64(KeyGrace)) / int64(time.Millisecond)
		if ttl < 1 {
			ttl = 1
		}

		keys += redisresp.Bulk(a.c.Key)
		args += redisresp.Bulk(strconv.FormatInt(a.add, 10)) + redisresp.Bulk(strconv.FormatInt(a.back, 10)) +
			redisresp.Bulk(strconv.FormatInt(a.need, 10)) + redisresp.Bulk(strconv.FormatInt(a.want, 10)) +
			redisresp.Bulk(strconv.FormatInt(ttl, 10)) + redisresp.Bulk(strconv.FormatInt(a.points, 10))
	}

	return keys + args
}
