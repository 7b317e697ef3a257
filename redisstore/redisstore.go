package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/rule"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/memstore"

	"github.com/tierlimit/tierlimit/limit"

	"github.com/tierlimit/tierlimit/redisresp"
)

// counterStore charges requests to layers. take evaluates the charge's layers
// in order, each under its key (charge.keys), and charges the
// request to every one of them or, when one refuses it (its count would
// exceed its points), to none: it stops at that layer, unless all is set (dry
// run), which charges every layer. It reports the outcome as a tally.
// windowStore (memory) and redisStore implement it.
//
// refund gives cost points back to layers that an earlier take charged, for
// a request a later, deferred charge refused (../after.go settle).
type CounterStore interface {
	Take(t *tally, c *charge)
	Refund(c *charge, cost int64)
}

// takeScript is the whole decision of one request in one round trip. It
// decides every layer before it writes any: the first loop plans the writes,
// which run only when no layer refused (or in a dry run), so a refused
// request leaves every key as it found it, byte for byte. The one write the
// first loop makes is a fixed layer's INCRBY of a live counter, which the
// reply needs (its count) and which is given back (DECRBY) before the script
// ends when a layer refuses: a script runs atomically, so no other client
// sees the count in between (only keyspace notifications, when turned on,
// tell the two commands).
//
// A fixed layer's key is a counter set with its expiry (SET PX) when it is
// new or stale and incremented otherwise (INCRBY keeps the TTL), so no key is
// ever left without a TTL; the reset is first hit + window, as in memory. An
// allowed request costs each fixed key two commands, PTTL then INCRBY or SET
// (BENCHMARKS.md, Redis calls per request); a refused one an INCRBY and a DECRBY
// more per key already charged.
//
// A sliding layer's key is a hash {c: count, p: previous window's count} that
// lives two windows from its window's start, so that the current window ends
// at PTTL - window and, once PTTL <= window, the key holds the window before.
// Time comes from the keys' TTLs alone, as for fixed layers. The arithmetic is
// ../limit/sliding.go's, in milliseconds.
//
// A token-bucket layer's key is a hash {r, n} holding its TAT (../limit/bucket.go)
// as r + n x window / rate microseconds, with 0 <= n < rate: integers that
// Lua numbers hold exactly, where the emission interval window / rate in
// microseconds may have a fraction. Time is Redis's clock (TIME), which every
// Traefik instance shares; the key expires when its bucket is full again.
//
// A key of another kind (left by a reload that changed a layer's algorithm),
// or one that outlives its layer's window (left by a reload that shortened the
// duration), is read as empty and started afresh when written, rather than
// failing the script, as memory starts such counters afresh.
//
// KEYS: one key per layer, in evaluation order.
// ARGV[1]: "1" charges every key (dry run; a sliding or token-bucket layer
// that refuses is not charged, as it cannot hold more than its points); "0"
// stops at the first refusal and then charges nothing; "2" does as "0" and,
// when every key is a fixed window and none refused, returns one integer
// instead of the array (see below).
// ARGV[2]: the request's cost, the amount charged to each layer.
// ARGV[4i-1], ARGV[4i], ARGV[4i+1], ARGV[4i+2], of KEYS[i]: points (a token
// bucket's burst), window (milliseconds), the algorithm ("0" fixed, "1"
// sliding, "2" token bucket) and a token bucket's points per window ("0" else).
// An algorithm followed by "b<ms>" ("0b900000") blocks a key the layer
// refuses for that long (blockDuration, ../memstore/block.go): its block key,
// KEYS[i]:block (the same hash tag on a cluster), is set with that TTL at the
// refusal, when the request is not a dry run, and while it lives the layer
// refuses, its reset the block's end; a dry-run layer (a reload may put it in
// dry run during a block) ignores the block and counts as usual.
// An algorithm prefixed with "c" ("c0", "c1", "c2") marks a check-only layer
// (a countStatus route, ../after.go): it refuses as the others do, but is
// never written, and when it allows, its count is the layer's as it is,
// without the request (0 for a key that does not exist), its reset that of
// the key as it is. A "d" after it, or alone ("d0", "cd1"), marks a dry-run
// layer: it refuses nothing, so one whose count exceeds its points neither
// stops the script nor keeps the others from being written; a fixed one is
// still charged, a sliding or token-bucket one is not (as in dry run).
//
// Returns count, milliseconds to reset, for each key evaluated, up to the
// first refusal (every key in a dry run). A count is what the layer would
// hold with the request; a refusing layer's exceeds its points. A sliding
// layer's count is its estimate; after a refusal its reset is when the
// request will next fit. A token bucket's count is the tokens in use with the
// request (burst + 1 on a refusal), its reset when it is full again or, after
// a refusal, when the request's tokens are back.
//
// The integer of ARGV[1] "2" is (left x (window + 1) + reset) x 16 + i for
// the layer with the fewest requests left (the first of equals), i counted
// from 0, whose window is in milliseconds: what the headers show, in one
// reply line, which redisPath reads with one parse (../paths.go). It is
// sent only while it fits a Lua number exactly (below 2^53), for i < 16.
const TakeScript = `
-- read runs a read command; a key of another kind reads as false, any
-- other error (a command the ACL denies) fails the script, never a key.
local function read(...)
  local v = redis.pcall(...)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then return false end
    error(v)
  end
  return v
end

-- incr adds cost to a counter and returns its new value, or false for a
-- key that holds no counter (of another kind, not an integer, at the bound
-- of one); any other error (a command the ACL denies) fails the script.
local function incr(k, cost)
  local v = redis.pcall('INCRBY', k, cost)
  if type(v) == 'table' and v.err then
    for _, e in ipairs({'WRONGTYPE', 'not an integer', 'overflow'}) do
      if string.find(v.err, e, 1, true) then return false end
    end
    error(v)
  end
  return v
end

-- fixed returns a fixed layer's count with the request, its milliseconds to
-- reset, the write to run when the request is allowed, and whether it
-- charged the key already (which the caller gives back, DECRBY, when
-- another layer refuses).
local function fixed(k, points, window, cost, check)
  local pttl = redis.call('PTTL', k)
  local live = pttl > 0 and pttl <= window
  if check then
    local v = live and read('GET', k)
    local n = type(v) == 'string' and tonumber(v)
    if not (n and n >= 0 and n == math.floor(n)) then n, pttl = 0, window end
    if n + cost <= points then return n, pttl, false, false end
    return n + cost, pttl, false, false
  end
  if live then
    local v = incr(k, cost)
    if v and v >= cost then return v, pttl, false, true end
    -- a negative count is no count: taken back, and restarted below
    if v then redis.call('DECRBY', k, cost) end
  end
  return cost, window, function()
    redis.call('SET', k, cost, 'PX', window)
  end, false
end

local function sliding(k, points, window, cost, check)
  local pttl = redis.call('PTTL', k)
  local v = false
  if pttl > 0 and pttl <= 2 * window then
    v = read('HMGET', k, 'c', 'p')
  end
  local cur, prev, left = 0, 0, window
  if v and pttl > window then
    cur, prev, left = tonumber(v[1]) or 0, tonumber(v[2]) or 0, pttl - window
  elseif v then
    prev, left = tonumber(v[1]) or 0, pttl
  end
  local count = cur + cost + math.floor(prev * left / window)
  if count <= points then
    if check then return count - cost, left, false end
    return count, left, function()
      if v and pttl > window then
        redis.call('HINCRBY', k, 'c', cost)
        return
      end
      if not v then redis.call('DEL', k) end
      redis.call('HSET', k, 'c', cost, 'p', prev)
      redis.call('PEXPIRE', k, left + window)
    end
  end
  local ttl
  if cur + cost <= points then
    ttl = left - math.ceil((points - cur - cost + 1) * window / prev) + 1
    if ttl < 1 then ttl = 1 end
    if ttl > left then ttl = left end
  else
    local y = window
    if cur > 0 and cost <= points then
      y = window - math.ceil((points - cost + 1) * window / cur) + 1
    end
    if y < 0 then y = 0 end
    ttl = left + y
  end
  return count, ttl, false
end

local function bucket(k, points, window, rate, cost, now, check)
  local d = window * 1000
  local v = read('HMGET', k, 'r', 'n')
  local r, n, valid = now, 0, false
  if v and v[1] and v[2] then
    r, n = tonumber(v[1]), tonumber(v[2])
    valid = r ~= nil and n ~= nil
    if not valid then r, n = now, 0 end
  end
  local ahead = (r - now) * rate + n * d
  if ahead < 0 then
    r, n, ahead = now, 0, 0
  end
  if ahead <= (points - cost) * d then
    if check then return math.ceil(ahead / d), math.ceil(ahead / rate / 1000), false end
    n = n + cost
    ahead = ahead + cost * d
    if n >= rate then
      local q = math.floor(n / rate)
      r, n = r + q * d, n - q * rate
    end
    local ttl = math.ceil(ahead / rate / 1000)
    return math.ceil(ahead / d), ttl, function()
      if not valid then redis.call('DEL', k) end
      redis.call('HSET', k, 'r', r, 'n', n)
      redis.call('PEXPIRE', k, ttl)
    end
  end
  local ttl = math.ceil((ahead - (points - cost) * d) / rate / 1000)
  local full = math.ceil(points * window / rate)
  if ttl > full then ttl = full end
  return points + 1, ttl, false
end

local all = ARGV[1] == '1'
local cost = tonumber(ARGV[2])
local out, writes, charged, refused, now = {}, {}, {}, false, false
for i = 1, #KEYS do
  local points = tonumber(ARGV[4 * i - 1])
  local window = tonumber(ARGV[4 * i])
  local algorithm = ARGV[4 * i + 1]
  local check = string.byte(algorithm, 1) == 99
  if check then algorithm = string.sub(algorithm, 2) end
  local dry = string.byte(algorithm, 1) == 100
  if dry then algorithm = string.sub(algorithm, 2) end
  local block, blocked = string.find(algorithm, 'b', 1, true), 0
  if block then
    block, algorithm = tonumber(string.sub(algorithm, block + 1)), string.sub(algorithm, 1, block - 1)
    blocked = redis.call('PTTL', KEYS[i] .. ':block')
  end
  local count, ttl, write, incremented
  if blocked > 0 and not dry then
    count, ttl, write = points + 1, blocked, false
  elseif algorithm == '2' then
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    count, ttl, write = bucket(KEYS[i], points, window, tonumber(ARGV[4 * i + 2]), cost, now, check)
  elseif algorithm == '1' then
    count, ttl, write = sliding(KEYS[i], points, window, cost, check)
  else
    count, ttl, write, incremented = fixed(KEYS[i], points, window, cost, check)
  end
  if incremented then charged[#charged + 1] = KEYS[i] end
  out[#out + 1] = count
  out[#out + 1] = ttl
  writes[#writes + 1] = write
  if count > points and not dry then
    refused = true
    if block and blocked <= 0 and not all then
      redis.call('SET', KEYS[i] .. ':block', '1', 'PX', block)
      out[#out] = block
    end
    if not all then break end
  end
end
if all or not refused then
  for i = 1, #writes do
    if writes[i] then writes[i]() end
  end
else
  for i = 1, #charged do
    redis.call('DECRBY', charged[i], cost)
  end
end
if ARGV[1] == '2' and not refused then
  local shown, left, ttl, m = -1, 0, 0, 0
  for i = 1, #KEYS do
    local points = tonumber(ARGV[4 * i - 1])
    local count = out[2 * i - 1]
    if ARGV[4 * i + 1] ~= '0' then
      return out
    end
    if shown < 0 or points - count < left then
      shown, left, ttl, m = i - 1, points - count, out[2 * i], tonumber(ARGV[4 * i]) + 1
    end
  end
  local v = (left * m + ttl) * 16 + shown
  if shown < 16 and v < 9007199254740992 then
    return v
  end
end
return out
`

// The scripts call only the commands README.md's ACL grants (its Redis
// deployments section): a command added here must be added there.
//
// refundScript gives back a charge: cost to each key that holds some, so
// that a request refused after an earlier charge (a credentialed request's
// global, charged before its ip) ends up charged nothing. A key that is gone
// or of another kind holds nothing to give back and is left alone; no count
// goes below zero, and no key's TTL grows.
//
// A negative cost is an outage's payment (owed.go): it adds to the keys, and
// a fixed or sliding key that is gone (Redis restarted empty) is created
// with the charge when ARGV[4n+1+i], after the n layers' arguments, gives
// the milliseconds left in its window (a sliding key then lives one window
// more, as takeScript's do); the refunds of requests send no such argument.
//
// KEYS: one key per layer. ARGV[1]: the cost. ARGV[4i-2] to ARGV[4i+1]: the
// layer's arguments, as takeScript reads them from ARGV[4i-1] (a "d" before
// the algorithm and a "b<ms>" after it change nothing here).
// Returns the number of keys given back to, as a one-integer array.
const refundScript = `
-- read runs a read command; a key of another kind reads as false, any
-- other error (a command the ACL denies) fails the script, never a key.
local function read(...)
  local v = redis.pcall(...)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then return false end
    error(v)
  end
  return v
end

local cost = tonumber(ARGV[1])
local given, now = 0, false
for i = 1, #KEYS do
  local k = KEYS[i]
  local algorithm = ARGV[4 * i]
  if string.byte(algorithm, 1) == 100 then algorithm = string.sub(algorithm, 2) end
  local block = string.find(algorithm, 'b', 1, true)
  if block then algorithm = string.sub(algorithm, 1, block - 1) end
  if algorithm == '2' then
    local v = read('HMGET', k, 'r', 'n')
    local r, n = false, false
    if v and v[1] and v[2] then
      r, n = tonumber(v[1]), tonumber(v[2])
    end
    if r and n then
      if not now then
        local clock = redis.call('TIME')
        now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
      end
      local d = tonumber(ARGV[4 * i - 1]) * 1000
      local rate = tonumber(ARGV[4 * i + 1])
      n = n - cost
      if n < 0 then
        local q = math.ceil(-n / rate)
        r, n = r - q * d, n + q * rate
      end
      local ahead = (r - now) * rate + n * d
      if ahead <= 0 then
        redis.call('DEL', k)
      else
        redis.call('HSET', k, 'r', r, 'n', n)
        redis.call('PEXPIRE', k, math.ceil(ahead / rate / 1000))
      end
      given = given + 1
    end
  else
    local c
    if algorithm == '1' then
      c = read('HMGET', k, 'c')
      c = c and c[1]
    else
      c = read('GET', k)
    end
    c = type(c) == 'string' and tonumber(c)
    local ttl = cost < 0 and tonumber(ARGV[4 * #KEYS + 1 + i])
    if c and c > 0 then
      if algorithm == '1' then
        redis.call('HINCRBY', k, 'c', -math.min(c, cost))
      else
        redis.call('DECRBY', k, math.min(c, cost))
      end
      given = given + 1
    elseif ttl and ttl > 0 and redis.call('PTTL', k) == -2 then
      if algorithm == '1' then
        redis.call('HSET', k, 'c', -cost, 'p', 0)
        redis.call('PEXPIRE', k, ttl + tonumber(ARGV[4 * i - 1]))
      else
        redis.call('SET', k, -cost, 'PX', ttl)
      end
      given = given + 1
    end
  end
end
return {given}
`

// The script's arguments, encoded: ARGV[1], how takeScript runs; ARGV[2], a
// cost of 1; and the algorithm and the no-rate value of a layer's arguments.
var (
	ArgStopAtRefusal = redisresp.Bulk("0")
	argChargeAll     = redisresp.Bulk("1") // dry run
	ArgOneInteger    = redisresp.Bulk("2") // the one-integer reply of redisPath
	argCostOne       = redisresp.Bulk("1")
	AlgoFixed        = redisresp.Bulk("0")
	AlgoSliding      = redisresp.Bulk("1")
	AlgoBucket       = redisresp.Bulk("2")
	ArgNoRate        = redisresp.Bulk("0")
)

// costArg encodes a request's cost, ARGV[2] of takeScript.
func CostArg(cost int64) string {
	if cost == 1 {
		return argCostOne
	}

	return redisresp.Bulk(strconv.FormatInt(cost, 10))
}

var ErrBadReply = errors.New("unexpected reply from the rate-limit script")

// redisStore keeps the counters in Redis, shared by every Traefik instance,
// with keys <keyPrefix>:<middleware name>:<layer>:<key>. When Redis fails or is
// slower than redis.timeout, local (the middleware's memory store, same limits)
// decides instead, and Redis is skipped during a back-off. Keys that Redis
// reported over their limit are refused locally until their reset.
type RedisStore struct {
	Prefix  string
	Name    string // the middleware's, and the channel of its resets (resetsub.go)
	Channel string
	Backend *RedisBackend
	Local   *windowStore
	// fallback decides in local when Redis cannot: local itself, or with
	// blocks (blockingStore) when a layer has a blockDuration (takeLocal).
	Fallback CounterStore
	Blocked  *BlockList
	Owed     *owedCounts      // what the fallback charged during an outage (owed.go)
	Clock    func() time.Time // the instance's (Plugin.now), for what no request times: a reset from another replica
	Calls    []redisresp.Call // the script's call head by number of layers
	Synced   *SyncState       // redis.syncInterval's counters (syncstore.go); nil: exact mode
}

// takeRedis is the script every redisStore runs, refundRedis its refund.
var (
	takeRedis   = redisresp.NewScript(TakeScript)
	refundRedis = redisresp.NewScript(refundScript)
)

// takeCall is takeScript's call head for n layers: n keys, then ARGV[1],
// ARGV[2] and 4 arguments per layer.
func TakeCall(n int) redisresp.Call {
	return takeRedis.Call(n, 5*n+2)
}

// callFor returns the script's call head for n layers.
func (s *RedisStore) CallFor(n int) redisresp.Call {
	if n < len(s.Calls) {
		return s.Calls[n]
	}

	return TakeCall(n)
}

// The healthy path (nothing blocked, Redis up) takes no lock and makes as few
// calls as it can (doc.go: frames).
func (s *RedisStore) Take(t *tally, c *charge) {
	if s.Synced != nil {
		SyncTake(s.Synced, t, c)
		return
	}

	// No layer to charge (an anonymous request to an instance with only
	// principal tiers, a credentialed one with global off, a request that
	// matches none of a routes-only instance's routes): nothing to ask Redis.
	if len(c.Layers) == 0 {
		t.Shown = -1
		return
	}

	if !c.All && s.Blocked.Size.Load() != 0 && s.TakeBlocked(t, c) {
		return
	}

	probe := false

	if s.Backend.Down.Load() {
		use := false
		if use, probe = s.Backend.Usable(c.Now); !use {
			s.TakeLocal(t, c)
			return
		}
	}

	if err := s.takeRedis(t, c); err != nil {
		// A closed pool is not Redis failing: this instance belongs to a
		// configuration that was replaced, and its backend was released. Nor
		// is a pool that stayed busy for redisresp.DefaultWaitTimeout: the
		// calls ahead of this one were answered.
		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
			s.Backend.Failed(c.Now, probe, err)
		}

		*t = tally{Cost: t.Cost}
		s.TakeLocal(t, c)

		return
	}

	// Only the back-off's probe ends an outage (../events/redisevents.go): a call in
	// flight when Redis failed may still succeed.
	if probe {
		s.Backend.Succeeded(c.Now)
	}
}

// takeLocal decides the request in memory, Redis being down or failing.
// A key Redis blocked is refused before (takeBlocked); a blockDuration
// refusal here starts a block in memory, and on the block list, so that
// it refuses the key for the rest of the block after Redis is back too.
func (s *RedisStore) TakeLocal(t *tally, c *charge) {
	s.Fallback.Take(t, c)

	if !t.Refused || c.All {
		oweCharged(s, t, c)
	}

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	l := c.Layers[t.Shown]
	key := c.Keys[t.Shown]
	first := s.Blocked.Add(l.BlockPrefix, key, t.Reset, c.Now)
	if first {
		ListenResets(s)
	}

	s.Blocked.hit(l.BlockPrefix, key, first)
}

// takeBlocked refuses the request locally when one of its keys is known to be
// over its limit, and reports whether it did. A key is blocked until the
// smallest cost fits again (redisStore.refused); a larger one refuses too,
// but in a sliding window or a token bucket it fits later than that, so
// such a request asks Redis, which tells when.
func (s *RedisStore) TakeBlocked(t *tally, c *charge) bool {
	costly := t.Cost > 1

	for i, l := range c.Layers {
		if costly && t.Cost > l.MinCost && (l.Sliding || l.Interval != 0) && l.BlockDuration == 0 {
			continue
		}

		if reset := s.Blocked.ResetOf(l.BlockPrefix, c.Keys[i], c.Now); reset != 0 {
			l.Stats.CountRedis(true)
			if l.BlockDuration != 0 {
				s.Blocked.hit(l.BlockPrefix, c.Keys[i], false)
			}

			*t = tally{Shown: i, Count: l.Points + 1, Reset: reset, Refused: true,
				ResetH: []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}}

			return true
		}
	}

	return false
}

// takeRedis runs the script and writes its outcome to t; on an error, t is
// to be discarded.
func (s *RedisStore) takeRedis(t *tally, c *charge) error {
	mode := ArgStopAtRefusal
	if c.All {
		mode = argChargeAll
	}

	// A cluster takes one call per slot (a cluster's DoInts fails at once).
	var ints []int64
	var serverErr string
	var err error

	cost := rule.CostOf(t)

	if s.Backend.cluster != nil {
		ints, serverErr, err = s.runCluster(s.Backend.cluster, c, cost)
	} else {
		ints, serverErr, err = s.CallFor(len(c.Layers)).RunIntsOn(s.Backend.Pool, EncodeCall(c, mode, cost))
	}

	if err != nil {
		return err
	}

	if serverErr != "" {
		return fmt.Errorf("running the rate-limit script: %s", serverErr)
	}

	return s.Record(t, c, ints)
}

// encodeCall encodes a script call's keys and arguments, but for its head:
// the layers' keys, then mode (ARGV[1] of takeScript, none for refundScript),
// the cost and each layer's arguments. The command is encoded here, from each
// layer's pre-encoded parts: under Yaegi, a loop over arguments in the RESP
// writer costs more than the round trip.
func EncodeCall(c *charge, mode string, cost int64) string {
	keys, args := "", mode+argCostOne
	if cost != 1 {
		args = mode + CostArg(cost)
	}

	for i, l := range c.Layers {
		if l.Calendar != 0 {
			keys, args = calendarCall(l, keys, args, c.Keys[i], c.Now)
			continue
		}

		args += l.RedisArgs

		if l.KeyKind == keyOfConst {
			keys += l.RedisConstKey
			continue
		}

		key := l.RedisKey + c.Keys[i]
		keys += "$" + strconv.Itoa(len(key)) + "\r\n" + key + "\r\n"
	}

	return keys + args
}

// refund gives back a request's charge of cost to layers, a charge that a
// later refusal of the same request voids (the up-front global charge of a
// credentialed request whose ip charge is refused). It goes where the charge
// most likely went: to the memory fallback while Redis is in back-off, else
// to Redis. A refund that fails is not retried in memory, which holds no such
// charge: the count stays cost too high until its window ends.
func (s *RedisStore) Refund(c *charge, cost int64) {
	if len(c.Layers) == 0 {
		return
	}

	if s.Synced != nil {
		syncRefund(s.Synced, c, cost)
		return
	}

	if s.Backend.Down.Load() {
		s.Local.Refund(c, cost)
		forgiveRefunded(s, c, cost)

		return
	}

	if err := refundOnRedis(s, c, cost); err != nil && !errors.Is(err, redisresp.ErrClosed) {
		s.Backend.Failed(c.Now, false, fmt.Errorf("refunding a charge: %w", err))
	}
}

// refundOnRedis runs the refund script of cost for layers in Redis (a
// negative cost adds to the keys that exist).
func refundOnRedis(s *RedisStore, c *charge, cost int64) error {
	if s.Backend.cluster != nil {
		return s.refundCluster(s.Backend.cluster, c, cost)
	}

	_, serverErr, err := refundRedis.Call(len(c.Layers), 5*len(c.Layers)+1).RunIntsOn(s.Backend.Pool, EncodeCall(c, "", cost))
	if err == nil && serverErr != "" {
		err = fmt.Errorf("running the refund script: %s", serverErr)
	}

	return err
}

// record writes the script's reply (count and milliseconds to reset per
// layer evaluated) to t, and checks it: on an error, t is to be discarded.
func (s *RedisStore) Record(t *tally, c *charge, ints []int64) error {
	layers, now, all, n := c.Layers, c.Now, c.All, len(ints)/2
	if len(ints)%2 != 0 || n == 0 || n > len(layers) {
		return fmt.Errorf("%w: %d integers for %d layers", ErrBadReply, len(ints), len(layers))
	}

	t.Shown = -1

	for i := 0; i < n; i++ {
		l, count, ttl := layers[i], ints[2*i], ints[2*i+1]

		// A check-only layer that allows reports the count without the
		// request, which may be 0.
		if count < 1 && (count < 0 || !l.CheckOnly) || ttl < 0 || ttl > l.MaxTTL {
			return fmt.Errorf("%w: count %d, ttl %d", ErrBadReply, count, ttl)
		}

		reset := now + ttl*int64(time.Millisecond)

		if count > l.Points {
			if s.refused(t, c, i, count, reset) && !all && i < n-1 {
				return fmt.Errorf("%w: layers answered after a refusal", ErrBadReply)
			}

			continue
		}

		if !t.Refused && !l.Quiet && (t.Shown < 0 || l.Points-count < t.Left) { // as tally.allow
			t.Shown, t.Count, t.Reset, t.Left = i, count, reset, l.Points-count
		}
	}

	// The script stops only at a refusal; a shorter reply that does not end in
	// one would let a request skip the layers it did not reach.
	if n < len(layers) && (all || !t.Refused) {
		return fmt.Errorf("%w: %d of %d layers answered", ErrBadReply, n, len(layers))
	}

	if !t.Refused {
		t.ResetH = []string{strconv.FormatInt(limit.CeilSeconds(t.Reset), 10)}
	}

	for i := 0; i < n; i++ {
		// A check-only layer counts as allowed what its later charge takes
		// (../after.go).
		if ints[2*i] > layers[i].Points {
			atomic.AddInt64(&layers[i].Stats.RedisRefused, 1)
		} else if !layers[i].CheckOnly {
			atomic.AddInt64(&layers[i].Stats.RedisAllowed, 1)
		}
	}

	// What Redis now holds, for the fallback (fallback.go); a refused
	// request changed nothing there.
	if !t.Refused || all {
		rememberAll(s.Local, c, ints)
	}

	return nil
}

// refused records that layers[i] refused with count: the key is blocked
// locally until reset, and the first refusal per window is reported. It
// reports whether the request is refused, so that takeRedis can tell a
// reply that goes on after it: not by a dry-run layer, which blocks nothing.
//
// A key is blocked only by a refusal of the smallest cost the layer is
// charged (layer.minCost): then every request to it would be refused until
// reset, whatever its cost. A key that refused a larger cost (an export of
// cost 10) may still take a smaller one (a plain read), so that refusal
// blocks nothing and the next such request asks Redis again; the block list
// only remembers it was reported (blockList.note).
func (s *RedisStore) refused(t *tally, c *charge, i int, count, reset int64) bool {
	l, key, now := c.Layers[i], c.Keys[i], c.Now

	first := false
	if !l.DryRun && (t.Cost <= 1 || t.Cost <= l.MinCost || l.BlockDuration != 0) {
		first = s.Blocked.Add(l.BlockPrefix, key, reset, now)
		if first {
			ListenResets(s)
		}

		if l.BlockDuration != 0 {
			s.Blocked.hit(l.BlockPrefix, key, first)
		}
	} else {
		first = s.Blocked.note(l.BlockPrefix, key, reset, now)
	}

	return t.RefuseAs(i, l, count, reset, []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}, first)
}

// Back-off bounds: Redis is skipped for minBackoff after a failure, doubling
// while probes keep failing, up to maxBackoff.
const (
	MinBackoff = 200 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// redisBackend is one Redis deployment as every middleware configured for it
// shares it: the client (a pool, or the Sentinel-found primary's) and whether
// Redis is usable now.
type RedisBackend struct {
	Pool     redisresp.Client
	cluster  *redisresp.Cluster  // pool as a cluster client, or nil
	Single   *redisresp.Pool     // pool as one server's pool, or nil (redisPath)
	Sentinel *redisresp.Sentinel // pool as a Sentinel's primary, or nil (redisPath)
	Address  string
	Log      io.Writer
	Resets   *resetListener // follows the resets of the backend's middlewares (resetsub.go)

	// down mirrors failing for the common path, which then takes no lock.
	Down atomic.Bool

	Mu      sync.Mutex
	failing bool
	probing bool  // one request is trying Redis after the back-off
	retryAt int64 // Unix nanoseconds
	Backoff time.Duration
	outage  redisOutage // which transitions are logged (../events/redisevents.go)
	debts   []func()    // what the stores' fallbacks charged, paid when Redis answers again (owed.go)
	Probe   redisProbe  // the goroutine that probes Redis while failing (probe.go)
}

// usable reports whether to call Redis at now. While failing, one request per
// back-off period is let through as a probe.
func (b *RedisBackend) Usable(now int64) (use, probe bool) {
	if !b.Down.Load() {
		return true, false
	}

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if !b.failing {
		return true, false
	}

	if b.probing || now < b.retryAt {
		return false, false
	}

	b.probing = true

	return true, true
}

// succeeded records the back-off's probe, started at now, succeeding. Leaving
// the fallback (down, the metric) and REDIS_RECOVERED are one transition.
func (b *RedisBackend) Succeeded(now int64) {
	b.Mu.Lock()

	// The line is written before the fallback ends, under the lock that
	// orders the transitions, so that whoever sees the metric at 0 finds it.
	if b.failing {
		b.event("REDIS_RECOVERED", "info", "", 0, now)
	}

	events.OutageSucceeded(&b.outage, now, true)
	b.failing, b.probing, b.Backoff = false, false, 0
	b.Down.Store(false)
	debts := b.debts
	b.debts = nil
	b.Mu.Unlock()

	if debts != nil {
		go payDebts(debts)
	}
}

// failed records a failed call. The first failure starts the back-off; a failed
// probe doubles it. Failures of calls that were in flight when Redis went away
// change nothing, so a burst of them does not inflate the back-off, and a
// call that started before the last outage ended changes nothing either.
func (b *RedisBackend) Failed(now int64, probe bool, err error) {
	b.Mu.Lock()

	kind := events.OutageFailed(&b.outage, now, probe)
	if kind == outageStale {
		b.Mu.Unlock()
		return
	}

	first := !b.failing
	if !first && !probe {
		b.Mu.Unlock()
		return
	}

	backoff := MinBackoff
	if !first {
		backoff = b.Backoff * 2
		if backoff > maxBackoff {
			backoff = maxBackoff
		}
	}

	// As in succeeded: the line before the metric moves, under the lock
	// that orders the transitions.
	if kind != outageQuiet {
		b.event("REDIS_UNAVAILABLE", "error", err.Error(), backoff, now)
	}

	b.failing, b.probing, b.Backoff = true, false, backoff
	b.Down.Store(true)
	b.retryAt = now + int64(backoff)
	start := scheduleProbe(b, now)
	b.Mu.Unlock()

	if start {
		go probeRedis(b)
	}
}

// switched logs that the sentinels named another primary, and lets the next
// request probe it at once when Redis was failing: the back-off waited for
// exactly this.
func (b *RedisBackend) switched(from, to string) {
	b.Mu.Lock()
	b.retryAt = 0
	b.Mu.Unlock()

	if b.Resets != nil {
		b.Resets.resubscribe()
	}

	line, err := events.RedisEventLine(redisEvent{Event: "REDIS_PRIMARY_CHANGED", Severity: "info", Address: b.Address, Primary: to, Previous: from}, time.Now().UnixNano())
	if err == nil {
		_, _ = b.Log.Write(line)
	}
}

func (b *RedisBackend) event(name, severity, msg string, retry time.Duration, now int64) {
	ev := redisEvent{Event: name, Severity: severity, Address: b.Address, Error: msg}
	if sp, ok := b.Pool.(interface{ Primary() string }); ok {
		ev.Primary = sp.Primary()
	}
	if retry > 0 {
		ev.Fallback = "memory"
		ev.RetryIn = retry.String()
	}

	line, err := events.RedisEventLine(ev, now)
	if err != nil {
		return
	}

	_, _ = b.Log.Write(line)
}

// backends shares one redisBackend per distinct Redis configuration across
// middlewares, routers and reloads, so reloads do not open new pools. A
// backend no instance uses any more is released (../lifetime/lifetime.go) and its pool
// closed: idle connections at once, busy ones when their call returns.
var Backends = &BackendRegistry{ByConfig: lifetime.NewHeldRegistry(CloseBackend)}

type BackendRegistry struct {
	ByConfig *heldRegistry // *redisBackend by configuration
}

func CloseBackend(v interface{}) {
	if b, ok := v.(*RedisBackend); ok {
		StopProbe(b)
		flushSyncsOn(b) // released at the same grace, in either order
		b.Resets.stop()
		b.Pool.Close()
	}
}

// get returns the backend of opts, held until ctx is cancelled.
func (r *BackendRegistry) Get(ctx context.Context, opts redisresp.Options) *RedisBackend {
	id := opts.Key()

	v := r.ByConfig.Take(ctx, id, func() interface{} {
		return NewBackend(opts)
	})

	b, _ := v.(*RedisBackend)

	return b
}

// newBackend makes the client opts describe: a pool, a Sentinel's primary
// (whose switches it logs) or a cluster.
func NewBackend(opts redisresp.Options) *RedisBackend {
	b := &RedisBackend{Pool: redisresp.NewClient(opts), Address: opts.Target(), Log: events.EventWriter}
	b.Probe.Done = make(chan struct{})
	if sc, ok := b.Pool.(*redisresp.Sentinel); ok {
		sc.OnSwitch = b.switched
		b.Sentinel = sc
	}

	b.cluster, _ = b.Pool.(*redisresp.Cluster)
	b.Single, _ = b.Pool.(*redisresp.Pool)
	b.Resets = NewResetListener(b, opts)

	return b
}

// blockList remembers keys that Redis reported over their limit, until their
// reset. It holds at most max keys. An entry is the layer's blockPrefix + the
// key: the prefix holds the layer's limits, so that an entry made under other
// limits (before a reload that raised the points, say) refuses nothing, where
// Redis might now allow.
type BlockList struct {
	Size atomic.Int64 // entries, so that the common case (none) takes no lock

	Mu    sync.Mutex
	max   int
	Until map[string]int64 // by layer.blockPrefix + key
	// noted holds the reset of keys reported refused by a cost that
	// blocks nothing (redisStore.refused), so that their refusals too are
	// reported once per window.
	noted map[string]int64
	// prefixes holds every blockPrefix an entry was made under, so that a
	// reset can find a key's entries without a scan (forgetLayerKey). A few
	// per layer: one per limits a reload gave it.
	prefixes map[string]bool
	// hits counts the requests each block of a blockDuration layer refused
	// (the status page's refused), by entry; a new block starts it again.
	hits map[string]int64
}

func NewBlockList(capacity int) *BlockList {
	return &BlockList{max: capacity, Until: map[string]int64{}, noted: map[string]int64{}, prefixes: map[string]bool{}, hits: map[string]int64{}}
}

// blockPrefix is a layer's part of its block list entries: its name and its
// Redis arguments (points, window, algorithm, rate), each ended by a NUL,
// which neither holds.
func BlockPrefix(l *layer) string {
	return l.Name + "\x00" + l.RedisArgs + "\x00"
}

// resetOf returns the reset of a blocked key, or 0.
func (b *BlockList) ResetOf(prefix, key string, now int64) int64 {
	if b.Size.Load() == 0 {
		return 0
	}

	id := prefix + key

	b.Mu.Lock()

	reset := b.Until[id]
	if reset != 0 && reset <= now {
		delete(b.Until, id)
		b.Size.Store(int64(len(b.Until)))

		reset = 0
	}

	b.Mu.Unlock()

	return reset
}

// add blocks a key until reset and reports whether it was not blocked yet, so
// that a refusal is reported once per key and window.
func (b *BlockList) Add(prefix, key string, reset, now int64) bool {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if old, ok := b.Until[id]; ok && old > now {
		if reset > old {
			b.Until[id] = reset
		}

		return false
	}

	memstore.TrimEntries(b.Until, b.max, now)
	b.Until[id] = reset
	b.prefixes[prefix] = true
	b.Size.Store(int64(len(b.Until)))

	noted := b.noted[id]

	return noted <= now
}

// hit counts a request that the block of a blockDuration layer's key
// refused: the first of a new block (start), or one more. At the cap, the
// counts of entries that are gone are dropped first.
func (b *BlockList) hit(prefix, key string, start bool) {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if len(b.hits) >= b.max {
		for k := range b.hits {
			if _, ok := b.Until[k]; !ok {
				delete(b.hits, k)
			}
		}
	}

	if start {
		b.hits[id] = 1
		return
	}

	b.hits[id]++
}

// note records that a key refused a request without being blocked, until
// reset, and reports whether no refusal of it was recorded yet (blocked or
// noted) in its window.
func (b *BlockList) note(prefix, key string, reset, now int64) bool {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if b.Until[id] > now {
		return false
	}

	if old := b.noted[id]; old > now {
		if reset > old {
			b.noted[id] = reset
		}

		return false
	}

	memstore.TrimEntries(b.noted, b.max, now)
	b.noted[id] = reset

	return true
}

// snapshot copies the keys blocked at now whose key starts with prefix.
func (b *BlockList) Snapshot(now int64, prefix string) []blockedKey {
	if b.Size.Load() == 0 {
		return nil
	}

	var out []blockedKey

	b.Mu.Lock()

	for id, reset := range b.Until {
		i := strings.IndexByte(id, 0)
		j := -1
		if i >= 0 {
			j = strings.IndexByte(id[i+1:], 0)
		}

		if reset > now && j >= 0 && strings.HasPrefix(id[i+j+2:], prefix) {
			out = append(out, blockedKey{Layer: id[:i], Prefix: id[:i+j+2], Key: id[i+j+2:], Reset: reset, Refused: b.hits[id]})
		}
	}

	b.Mu.Unlock()

	return out
}

// nsPerMillisecond is int64(time.Millisecond) as an untyped constant (see
// nsPerSecond).
const NsPerMillisecond = 1000000

// blockListLive is the Redis block list's: the latest end of a block, or of a
// window whose refusal was reported (noted), so that the middleware
// configured again neither asks Redis for a key it knows blocked nor
// reports a window's refusal twice.
func BlockListLive(v interface{}, now int64) int64 {
	b, ok := v.(*BlockList)
	if !ok {
		return 0
	}

	b.Mu.Lock()
	defer b.Mu.Unlock()

	return memstore.LatestAfter(b.noted, memstore.LatestAfter(b.Until, 0))
}
