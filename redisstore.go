package tierlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// counterStore charges requests to layers. take charges one hit to each layer
// in order, under the key layer.keyFor(client, principal, req); unless all is set
// it stops after the first layer whose count exceeds its points. It reports
// the outcome as a tally. windowStore (memory) and redisStore implement it.
//
// refund gives cost points back to layers that an earlier take charged, for
// a request a later, deferred charge refused (chain.go settle).
type counterStore interface {
	take(t *tally, now int64, layers []*layer, client, principal string, req *http.Request, all bool)
	refund(now int64, layers []*layer, client, principal string, req *http.Request, cost int64)
}

// takeScript is the whole decision of one request in one round trip.
//
// A fixed layer's key is a counter created with its expiry (SET NX PX) before
// it is incremented, so no key is ever left without a TTL; the reset is first
// hit + window, as in memory.
//
// A sliding layer's key is a hash {c: count, p: previous window's count} that
// lives two windows from its window's start, so that the current window ends
// at PTTL - window and, once PTTL <= window, the key holds the window before.
// Time comes from the keys' TTLs alone, as for fixed layers. The arithmetic is
// sliding.go's, in milliseconds; only allowed requests are counted.
//
// A token-bucket layer's key is a hash {r, n} holding its TAT (tokenbucket.go)
// as r + n x window / points microseconds, with 0 <= n < points: integers that
// Lua numbers hold exactly, where the emission interval window / points in
// microseconds may have a fraction. Time is Redis's clock (TIME), which every
// Traefik instance shares; the key expires when its bucket is full again.
//
// A key of another kind (left by a reload that changed a layer's algorithm),
// or one that outlives its layer's window (left by a reload that shortened the
// duration), is started afresh rather than failing the script, as memory
// starts such counters afresh.
//
// KEYS: one key per layer, in evaluation order.
// ARGV[1]: "1" charges every key (dry run); "0" stops after the first refusal;
// "2" does as "0" and, when every key is a fixed window and none refused,
// returns one integer instead of the array (see below).
// ARGV[4i-2], ARGV[4i-1], ARGV[4i], ARGV[4i+1], of KEYS[i]: points (a token
// bucket's burst), window (milliseconds), the algorithm ("0" fixed, "1"
// sliding, "2" token bucket) and a token bucket's points per window ("0" else).
// Returns count, milliseconds to reset, for each key charged. A sliding
// layer's count is its estimate; after a refusal its reset is when a request
// will next fit. A token bucket's count is the tokens missing after the
// request (burst + 1 on a refusal), its reset when it is full again or, after
// a refusal, when its next token is back.
//
// The integer of ARGV[1] "2" is (left x (window + 1) + reset) x 16 + i for
// the layer with the fewest requests left (the first of equals), i counted
// from 0, whose window is in milliseconds: what the headers show, in one
// reply line, which redisPath reads with one parse (redisfast.go). It is
// sent only while it fits a Lua number exactly (below 2^53), for i < 16.
const takeScript = `
local all = ARGV[1] == '1'
local out = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local points = tonumber(ARGV[4 * i - 2])
  local window = tonumber(ARGV[4 * i - 1])
  local algorithm = ARGV[4 * i]
  local count, ttl
  if algorithm == '2' then
    local rate = tonumber(ARGV[4 * i + 1])
    local d = window * 1000
    local clock = redis.call('TIME')
    local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    local v = redis.pcall('HMGET', k, 'r', 'n')
    local r, n = now, 0
    if type(v) == 'table' and not v.err and v[1] and v[2] then
      r, n = tonumber(v[1]), tonumber(v[2])
    else
      redis.call('DEL', k)
    end
    local ahead = (r - now) * rate + n * d
    if ahead < 0 then
      r, n, ahead = now, 0, 0
    end
    if ahead <= (points - 1) * d then
      n = n + 1
      ahead = ahead + d
      if n >= rate then
        r, n = r + d, n - rate
      end
      count = math.ceil(ahead / d)
      ttl = math.ceil(ahead / rate / 1000)
      redis.call('HSET', k, 'r', r, 'n', n)
      redis.call('PEXPIRE', k, ttl)
    else
      count = points + 1
      ttl = math.ceil((ahead - (points - 1) * d) / rate / 1000)
    end
  elseif algorithm ~= '1' then
    redis.call('SET', k, 0, 'NX', 'PX', window)
    count = redis.pcall('INCR', k)
    if type(count) == 'table' then
      redis.call('SET', k, 1, 'PX', window)
      count = 1
    end
    ttl = redis.call('PTTL', k)
    if ttl < 0 or ttl > window then
      redis.call('SET', k, 1, 'PX', window)
      count, ttl = 1, window
    end
  else
    local pttl = redis.call('PTTL', k)
    local v = false
    if pttl > 0 and pttl <= 2 * window then
      v = redis.pcall('HMGET', k, 'c', 'p')
      if v.err then v = false end
    end
    local cur, prev, left = 0, 0, window
    if v and pttl > window then
      cur, prev, left = tonumber(v[1]) or 0, tonumber(v[2]) or 0, pttl - window
    elseif v then
      prev, left = tonumber(v[1]) or 0, pttl
      redis.call('HSET', k, 'c', 0, 'p', prev)
      redis.call('PEXPIRE', k, left + window)
    else
      redis.call('DEL', k)
      redis.call('HSET', k, 'c', 0, 'p', 0)
      redis.call('PEXPIRE', k, 2 * window)
    end
    count = cur + 1 + math.floor(prev * left / window)
    ttl = left
    if count <= points then
      redis.call('HINCRBY', k, 'c', 1)
    elseif cur < points then
      ttl = left - math.ceil((points - cur) * window / prev) + 1
      if ttl < 1 then ttl = 1 end
      if ttl > left then ttl = left end
    else
      local y = window - math.ceil(points * window / cur) + 1
      if y < 0 then y = 0 end
      ttl = left + y
    end
  end
  out[#out + 1] = count
  out[#out + 1] = ttl
  if count > points and not all then
    break
  end
end
if ARGV[1] == '2' and #out == 2 * #KEYS then
  local shown, left, ttl, m = -1, 0, 0, 0
  for i = 1, #KEYS do
    local points = tonumber(ARGV[4 * i - 2])
    local count = out[2 * i - 1]
    if count > points or ARGV[4 * i] ~= '0' then
      return out
    end
    if shown < 0 or points - count < left then
      shown, left, ttl, m = i - 1, points - count, out[2 * i], tonumber(ARGV[4 * i - 1]) + 1
    end
  end
  local v = (left * m + ttl) * 16 + shown
  if shown < 16 and v < 9007199254740992 then
    return v
  end
end
return out
`

// The script's first argument, encoded.
var (
	bulkFalse  = redisresp.Bulk("0")
	bulkTrue   = redisresp.Bulk("1")
	bulkBucket = redisresp.Bulk("2")
	bulkOneInt = redisresp.Bulk("2") // ARGV[1]: the one-integer reply of redisPath
)

var errBadReply = errors.New("unexpected reply from the rate-limit script")

// redisStore keeps the counters in Redis, shared by every Traefik instance,
// with keys <keyPrefix>:<middleware name>:<layer>:<key>. When Redis fails or is
// slower than redis.timeout, local (the middleware's memory store, same limits)
// decides instead, and Redis is skipped during a back-off. Keys that Redis
// reported over their limit are refused locally until their reset.
type redisStore struct {
	prefix  string
	backend *redisBackend
	local   *windowStore
	blocked *blockList
	calls   []redisresp.Call // the script's call head by number of layers
}

// takeRedis is the script every redisStore runs.
var takeRedis = redisresp.NewScript(takeScript)

// callFor returns the script's call head for n layers.
func (s *redisStore) callFor(n int) redisresp.Call {
	if n < len(s.calls) {
		return s.calls[n]
	}

	return takeRedis.Call(n, 5*n+1)
}

// The healthy path (nothing blocked, Redis up) takes no lock and makes as few
// calls as it can (doc.go: frames).
func (s *redisStore) take(t *tally, now int64, layers []*layer, client, principal string, req *http.Request, all bool) {
	// No layer to charge (an anonymous request to an instance with only
	// principal tiers, a credentialed one with global off, a request that
	// matches none of a routes-only instance's routes): nothing to ask Redis.
	if len(layers) == 0 {
		t.shown = -1
		return
	}

	if !all && s.blocked.size.Load() != 0 && s.takeBlocked(t, now, layers, client, principal, req) {
		return
	}

	probe := false

	if s.backend.down.Load() {
		use := false
		if use, probe = s.backend.usable(now); !use {
			s.local.take(t, now, layers, client, principal, req, all)
			return
		}
	}

	if err := s.takeRedis(t, now, layers, client, principal, req, all); err != nil {
		// A closed pool is not Redis failing: this instance belongs to a
		// configuration that was replaced, and its backend was released.
		if !errors.Is(err, redisresp.ErrClosed) {
			s.backend.failed(now, probe, err)
		}

		*t = tally{}
		s.local.take(t, now, layers, client, principal, req, all)

		return
	}

	if s.backend.down.Load() {
		s.backend.succeeded()
	}
}

// takeBlocked refuses the request locally when one of its keys is known to be
// over its limit, and reports whether it did.
func (s *redisStore) takeBlocked(t *tally, now int64, layers []*layer, client, principal string, req *http.Request) bool {
	for i, l := range layers {
		if reset := s.blocked.resetOf(l.name, l.keyFor(client, principal, req), now); reset != 0 {
			l.stats.countRedis(true)

			*t = tally{shown: i, count: l.points + 1, reset: reset, refused: true,
				resetH: []string{formatInt(ceilSeconds(reset))}}

			return true
		}
	}

	return false
}

// takeRedis runs the script and writes its outcome to t; on an error, t is
// to be discarded.
func (s *redisStore) takeRedis(t *tally, now int64, layers []*layer, client, principal string, req *http.Request, all bool) error {
	// The command is encoded here, from each layer's pre-encoded arguments:
	// under Yaegi, a loop over arguments in the RESP writer costs more than
	// the round trip.
	keys, args := "", bulkFalse
	if all {
		args = bulkTrue
	}

	for _, l := range layers {
		args += l.redisArgs

		if l.keyKind == keyOfConst {
			keys += l.redisConstKey
			continue
		}

		key := client
		if l.keyKind != keyOfClient {
			key = l.keyFor(client, principal, req)
		}

		key = l.redisKey + key
		keys += "$" + strconv.Itoa(len(key)) + "\r\n" + key + "\r\n"
	}

	// A cluster takes one call per slot (a cluster's DoInts fails at once).
	// Under Yaegi this branch costs the single-server path its frame slots
	// (BENCHMARKS.md, section 6); a store type per deployment would not, at
	// the price of a second copy of this function.
	var ints []int64
	var serverErr string
	var err error

	if s.backend.cluster != nil {
		ints, serverErr, err = s.runCluster(s.backend.cluster, layers, client, principal, req, all)
	} else {
		ints, serverErr, err = s.callFor(len(layers)).RunIntsOn(s.backend.pool, keys+args)
	}

	if err != nil {
		return err
	}

	if serverErr != "" {
		return fmt.Errorf("running the rate-limit script: %s", serverErr)
	}

	return s.record(t, ints, now, layers, client, principal, req, all)
}

// record writes the script's reply (count and milliseconds to reset per
// layer charged) to t, and checks it: on an error, t is to be discarded.
func (s *redisStore) record(t *tally, ints []int64, now int64, layers []*layer, client, principal string, req *http.Request, all bool) error {
	n := len(ints) / 2
	if len(ints)%2 != 0 || n == 0 || n > len(layers) {
		return fmt.Errorf("%w: %d integers for %d layers", errBadReply, len(ints), len(layers))
	}

	t.shown = -1

	for i := 0; i < n; i++ {
		l, count, ttl := layers[i], ints[2*i], ints[2*i+1]

		if count < 1 || ttl < 0 || ttl > l.maxTTL {
			return fmt.Errorf("%w: count %d, ttl %d", errBadReply, count, ttl)
		}

		reset := now + ttl*int64(time.Millisecond)

		if count > l.points {
			if s.refused(t, i, l, count, reset, now, client, principal, req) && !all && i < n-1 {
				return fmt.Errorf("%w: layers answered after a refusal", errBadReply)
			}

			continue
		}

		if !t.refused && (t.shown < 0 || l.points-count < t.left) {
			t.shown, t.count, t.reset, t.left = i, count, reset, l.points-count
		}
	}

	// The script stops only at a refusal; a shorter reply that does not end in
	// one would let a request skip the layers it did not reach.
	if n < len(layers) && (all || !t.refused) {
		return fmt.Errorf("%w: %d of %d layers answered", errBadReply, n, len(layers))
	}

	if !t.refused {
		t.resetH = []string{formatInt(ceilSeconds(t.reset))}
	}

	for i := 0; i < n; i++ {
		if ints[2*i] > layers[i].points {
			atomic.AddInt64(&layers[i].stats.redisRefused, 1)
		} else {
			atomic.AddInt64(&layers[i].stats.redisAllowed, 1)
		}
	}

	return nil
}

// refused records that layers[i] refused with count: the key is blocked
// locally until reset, and the first refusal per window is reported. It
// returns true, so that takeRedis can tell a reply that goes on after it.
func (s *redisStore) refused(t *tally, i int, l *layer, count, reset, now int64, client, principal string, req *http.Request) bool {
	first := s.blocked.add(l.name, l.keyFor(client, principal, req), reset, now)
	t.refuse(i, count, reset, []string{formatInt(ceilSeconds(reset))}, first)

	return true
}

// Back-off bounds: Redis is skipped for minBackoff after a failure, doubling
// while probes keep failing, up to maxBackoff.
const (
	minBackoff = 200 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// redisBackend is one Redis deployment as every middleware configured for it
// shares it: the client (a pool, or the Sentinel-found primary's) and whether
// Redis is usable now.
type redisBackend struct {
	pool     redisresp.Client
	cluster  *redisresp.Cluster  // pool as a cluster client, or nil
	single   *redisresp.Pool     // pool as one server's pool, or nil (redisPath)
	sentinel *redisresp.Sentinel // pool as a Sentinel's primary, or nil (redisPath)
	address  string
	log      io.Writer

	// down mirrors failing for the common path, which then takes no lock.
	down atomic.Bool

	mu      sync.Mutex
	failing bool
	probing bool  // one request is trying Redis after the back-off
	retryAt int64 // Unix nanoseconds
	backoff time.Duration
}

// usable reports whether to call Redis at now. While failing, one request per
// back-off period is let through as a probe.
func (b *redisBackend) usable(now int64) (use, probe bool) {
	if !b.down.Load() {
		return true, false
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if !b.failing {
		return true, false
	}

	if b.probing || now < b.retryAt {
		return false, false
	}

	b.probing = true

	return true, true
}

func (b *redisBackend) succeeded() {
	if !b.down.Load() {
		return
	}

	b.mu.Lock()
	recovered := b.failing
	b.failing, b.probing, b.backoff = false, false, 0
	b.down.Store(false)
	b.mu.Unlock()

	if recovered {
		b.event("REDIS_RECOVERED", "info", "", 0)
	}
}

// failed records a failed call. The first failure starts the back-off; a failed
// probe doubles it. Failures of calls that were in flight when Redis went away
// change nothing, so a burst of them does not inflate the back-off.
func (b *redisBackend) failed(now int64, probe bool, err error) {
	b.mu.Lock()

	first := !b.failing

	switch {
	case first:
		b.failing, b.backoff = true, minBackoff
		b.down.Store(true)
	case probe:
		b.backoff *= 2
		if b.backoff > maxBackoff {
			b.backoff = maxBackoff
		}
	default:
		b.mu.Unlock()
		return
	}

	b.probing = false
	b.retryAt = now + int64(b.backoff)
	backoff := b.backoff
	b.mu.Unlock()

	if first {
		b.event("REDIS_UNAVAILABLE", "error", err.Error(), backoff)
	}
}

// switched logs that the sentinels named another primary, and lets the next
// request probe it at once when Redis was failing: the back-off waited for
// exactly this.
func (b *redisBackend) switched(from, to string) {
	b.mu.Lock()
	b.retryAt = 0
	b.mu.Unlock()

	line, err := json.Marshal(redisEvent{Event: "REDIS_PRIMARY_CHANGED", Severity: "info", Address: b.address, Primary: to, Previous: from})
	if err == nil {
		_, _ = b.log.Write(append(line, '\n'))
	}
}

type redisEvent struct {
	Event    string `json:"event"`
	Severity string `json:"severity"`
	Address  string `json:"address"`
	Primary  string `json:"primary,omitempty"`
	Previous string `json:"previous,omitempty"`
	Error    string `json:"error,omitempty"`
	Fallback string `json:"fallback,omitempty"`
	RetryIn  string `json:"retryIn,omitempty"`
}

func (b *redisBackend) event(name, severity, msg string, retry time.Duration) {
	ev := redisEvent{Event: name, Severity: severity, Address: b.address, Error: msg}
	if sp, ok := b.pool.(interface{ Primary() string }); ok {
		ev.Primary = sp.Primary()
	}
	if retry > 0 {
		ev.Fallback = "memory"
		ev.RetryIn = retry.String()
	}

	line, err := json.Marshal(ev)
	if err != nil {
		return
	}

	_, _ = b.log.Write(append(line, '\n'))
}

// backends shares one redisBackend per distinct Redis configuration across
// middlewares, routers and reloads, so reloads do not open new pools. A
// backend no instance uses any more is released (lifetime.go) and its pool
// closed: idle connections at once, busy ones when their call returns.
var backends = &backendRegistry{byConfig: newHeldRegistry(closeBackend)}

type backendRegistry struct {
	byConfig *heldRegistry // *redisBackend by configuration
}

func closeBackend(v interface{}) {
	if b, ok := v.(*redisBackend); ok {
		b.pool.Close()
	}
}

// get returns the backend of opts, held until ctx is cancelled.
func (r *backendRegistry) get(ctx context.Context, opts redisresp.Options) *redisBackend {
	id := opts.Key()

	v := r.byConfig.take(ctx, id, func() interface{} {
		return newBackend(opts)
	})

	b, _ := v.(*redisBackend)

	return b
}

// newBackend makes the client opts describe: a pool, a Sentinel's primary
// (whose switches it logs) or a cluster.
func newBackend(opts redisresp.Options) *redisBackend {
	b := &redisBackend{pool: redisresp.NewClient(opts), address: opts.Target(), log: eventWriter}
	if sc, ok := b.pool.(*redisresp.Sentinel); ok {
		sc.OnSwitch = b.switched
		b.sentinel = sc
	}

	b.cluster, _ = b.pool.(*redisresp.Cluster)
	b.single, _ = b.pool.(*redisresp.Pool)

	return b
}

// blockList remembers keys that Redis reported over their limit, until their
// reset. It holds at most max keys.
type blockList struct {
	size atomic.Int64 // entries, so that the common case (none) takes no lock

	mu    sync.Mutex
	max   int
	until map[string]int64 // by layer + "\x00" + key
}

func newBlockList(capacity int) *blockList {
	return &blockList{max: capacity, until: map[string]int64{}}
}

// resetOf returns the reset of a blocked key, or 0.
func (b *blockList) resetOf(layer, key string, now int64) int64 {
	if b.size.Load() == 0 {
		return 0
	}

	id := layer + "\x00" + key

	b.mu.Lock()

	reset := b.until[id]
	if reset != 0 && reset <= now {
		delete(b.until, id)
		b.size.Store(int64(len(b.until)))

		reset = 0
	}

	b.mu.Unlock()

	return reset
}

// add blocks a key until reset and reports whether it was not blocked yet, so
// that a refusal is reported once per key and window.
func (b *blockList) add(layer, key string, reset, now int64) bool {
	id := layer + "\x00" + key

	b.mu.Lock()
	defer b.mu.Unlock()

	if old, ok := b.until[id]; ok && old > now {
		if reset > old {
			b.until[id] = reset
		}

		return false
	}

	if len(b.until) >= b.max {
		for k, r := range b.until {
			if r <= now {
				delete(b.until, k)
			}
		}

		for k := range b.until {
			if len(b.until) < b.max {
				break
			}

			delete(b.until, k)
		}
	}

	b.until[id] = reset
	b.size.Store(int64(len(b.until)))

	return true
}

// blockedKey is a block list entry as the status endpoint lists it.
type blockedKey struct {
	layer string
	key   string
	reset int64
}

// snapshot copies the keys blocked at now whose key starts with prefix.
func (b *blockList) snapshot(now int64, prefix string) []blockedKey {
	if b.size.Load() == 0 {
		return nil
	}

	var out []blockedKey

	b.mu.Lock()

	for id, reset := range b.until {
		i := strings.IndexByte(id, 0)
		if reset > now && i >= 0 && strings.HasPrefix(id[i+1:], prefix) {
			out = append(out, blockedKey{layer: id[:i], key: id[i+1:], reset: reset})
		}
	}

	b.mu.Unlock()

	return out
}
