package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rediscall"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// luaRead defines the scripts' read, which runs a read command: a key of
// another kind reads as false, any other error (a command the ACL denies)
// fails the script, never a key.
const luaRead = `
local function read(...)
  local v = redis.pcall(...)
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then return false end
    error(v)
  end
  return v
end
`

// luaGrace defines the scripts' grace: KeyGrace in milliseconds.
var luaGrace = "local grace = " + strconv.FormatInt(int64(KeyGrace/time.Millisecond), 10) + "\n"

// TakeScript is the whole decision of one request in one round trip. It
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
// A calendar layer's key (calendar.go) names its period, and its window is
// what is left of the period on the caller's clock, which neither Redis's
// clock nor another replica's agrees with to the millisecond: the key is
// live whatever its TTL (up to the calendar's longest period and KeyGrace),
// its reset is the caller's window, and it lives KeyGrace past the period's
// end on the clock of the replica that made it, or that counted in it last
// while its period ended later (PEXPIRE; never shorter), so that a replica
// whose clock is behind never finds it gone while the period is open.
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
// sliding, "2" token bucket, "3" concurrency) and a token bucket's points per
// window (a concurrency layer's: the request's member, concurrency.go; a
// calendar layer's: its calendar's longest period in milliseconds; "0"
// else).
// An algorithm followed by "b<ms>" ("0b900000") blocks a key the layer
// refuses for that long (blockDuration, ../memstore/block.go): its block key,
// KEYS[i]:block (the same hash tag on a cluster), is set with that TTL at the
// refusal, when the request is not a dry run, and while it lives the layer
// refuses, its reset the block's end; a dry-run layer (a reload may put it in
// dry run during a block) ignores the block and counts as usual.
// An algorithm followed by "w<ms>" ("0w900", after a block's "b<ms>") is a
// layer with a maxDelay of that long: a request it would refuse, whose place
// comes within it, reserves the place now and is allowed, and the reply
// ends with one more integer, the longest wait in milliseconds (an odd
// length: takeInRedis reads it). A token bucket's TAT moves ahead; a sliding
// window is charged in the window its place is in (the next one: the key
// then lives two windows from that one's start, and until it starts its
// estimate weighs the window before in full, and more); a fixed window
// whose points are spent starts its next window at once (a key that
// outlives its window by at most the maxDelay is a window that starts in
// PTTL - window, which a request waits for). A calendar layer's next period
// is another key, which the caller names when its period ends within the
// maxDelay: "w<ms>n<start>:<length>" (calendar.go), the next period's
// start in Unix seconds (its key is KEYS[i] with that start) and its length
// in milliseconds; a request its period cannot hold is charged there, and
// waits for the period's end.
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
var TakeScript = luaRead + luaGrace + `
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

-- nextPeriod is a calendar layer's place in its next period, key nk, which
-- the caller names when its period ends within the maxDelay (window from
-- now), nlen milliseconds long, for a request its period cannot hold: the
-- request waits window for it, or, that period full too, is refused until
-- that period's end (as memory's). The key lives the next period and the
-- grace (never shorter), as that period's own requests make it; one is
-- live while its TTL is within bound and the grace (the calendar's longest
-- period and the maxDelay).
local function nextPeriod(nk, points, window, cost, bound, nlen)
  local pttl = redis.call('PTTL', nk)
  local n = false
  if pttl > 0 and pttl <= bound + grace then
    n = read('GET', nk)
    n = type(n) == 'string' and tonumber(n)
    if not (n and n >= 0 and n == math.floor(n)) then n = false end
  end
  if (n or 0) + cost > points then return (n or 0) + cost, window + nlen, false, false, 0 end
  local life = window + nlen + grace
  return (n or 0) + cost, window + nlen, function()
    if not n then
      redis.call('SET', nk, cost, 'PX', life)
      return
    end
    redis.call('INCRBY', nk, cost)
    if pttl < life then redis.call('PEXPIRE', nk, life) end
  end, false, window
end

-- fixed returns a fixed layer's count with the request, its milliseconds to
-- reset, the write to run when the request is allowed, and whether it
-- charged the key already (which the caller gives back, DECRBY, when
-- another layer refuses). A calendar layer's key (span > 0) names its
-- period, whose rest on the caller's clock is window: it is live whatever
-- its TTL up to the calendar's longest period and the grace, its reset is
-- window, and it lives window + grace, made longer (never shorter) when a
-- caller's period ends after it.
local function fixed(k, points, window, cost, check, span, md, nk, nlen)
  local pttl = redis.call('PTTL', k)
  local live, reset, life, ahead = pttl > 0 and pttl <= window, pttl, window, 0
  if span > 0 then
    live, reset, life = pttl > 0 and pttl <= span + grace, window, window + grace
  elseif md > 0 and pttl > window and pttl <= window + md then
    live, ahead = true, pttl - window
  end
  if check then
    local v = live and read('GET', k)
    local n = type(v) == 'string' and tonumber(v)
    if not (n and n >= 0 and n == math.floor(n)) then n, reset = 0, window end
    if n + cost <= points then return n, reset, false, false end
    return n + cost, reset, false, false
  end
  if live then
    local v = incr(k, cost)
    if v and v > points and nk and cost <= points then
      -- the next period, another key: this one keeps its count
      redis.call('DECRBY', k, cost)
      return nextPeriod(nk, points, window, cost, span + md, nlen)
    end
    if v and v >= cost and span > 0 and pttl < window then
      return v, reset, function() redis.call('PEXPIRE', k, life) end, true
    end
    if v and v > points and md > 0 and ahead == 0 and span == 0 and cost <= points and pttl <= md then
      -- the next window, which starts in pttl: this one keeps its count
      redis.call('DECRBY', k, cost)
      return cost, pttl + window, function()
        redis.call('SET', k, cost, 'PX', pttl + window)
      end, false, pttl
    end
    if v and v >= cost then return v, reset, false, true, ahead end
    -- a negative count is no count: taken back, and restarted below
    if v then redis.call('DECRBY', k, cost) end
  end
  return cost, window, function()
    redis.call('SET', k, cost, 'PX', life)
  end, false, 0
end

local function sliding(k, points, window, cost, check, md)
  local pttl = redis.call('PTTL', k)
  local v = false
  if pttl > 0 and pttl <= 2 * window + md then
    v = read('HMGET', k, 'c', 'p')
  end
  local cur, prev, toEnd = 0, 0, window
  if v and pttl > window then
    cur, prev, toEnd = tonumber(v[1]) or 0, tonumber(v[2]) or 0, pttl - window
  elseif v then
    prev, toEnd = tonumber(v[1]) or 0, pttl
  end
  local count = cur + cost + math.floor(prev * toEnd / window)
  local function charge()
    if v and pttl > window then
      redis.call('HINCRBY', k, 'c', cost)
      return
    end
    if not v then redis.call('DEL', k) end
    redis.call('HSET', k, 'c', cost, 'p', prev)
    redis.call('PEXPIRE', k, toEnd + window)
  end
  if count <= points then
    if check then return count - cost, toEnd, false, 0 end
    return count, toEnd, charge, 0
  end
  local ttl
  if cur + cost <= points then
    ttl = toEnd - math.ceil((points - cur - cost + 1) * window / prev) + 1
    if ttl < 1 then ttl = 1 end
    if ttl > toEnd then ttl = toEnd end
  else
    local y = window
    if cur > 0 and cost <= points then
      y = window - math.ceil((points - cost + 1) * window / cur) + 1
    end
    if y < 0 then y = 0 end
    ttl = toEnd + y
  end
  if md == 0 or cost > points or ttl > md then return count, ttl, false, 0 end
  if ttl <= toEnd then
    return cur + cost + math.floor(prev * (toEnd - ttl) / window), toEnd, charge, ttl
  end
  -- the next window, which its place is in: this one weighs as the one before
  return cost + math.floor(cur * (toEnd + window - ttl) / window), toEnd + window, function()
    redis.call('HSET', k, 'c', cost, 'p', cur)
    redis.call('PEXPIRE', k, toEnd + 2 * window)
  end, ttl
end

local function bucket(k, points, window, rate, cost, now, check, md)
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
  local wait = 0
  local late = (ahead - (points - cost) * d) / rate / 1000
  if late > 0 and md > 0 and cost <= points and late <= md then
    wait = math.ceil(late)
  end
  if ahead <= (points - cost) * d or wait > 0 then
    if check then return math.ceil(ahead / d), math.ceil(ahead / rate / 1000), false, 0 end
    n = n + cost
    ahead = ahead + cost * d
    if n >= rate then
      local q = math.floor(n / rate)
      r, n = r + q * d, n - q * rate
    end
    local ttl = math.ceil(ahead / rate / 1000)
    local used = math.ceil(ahead / d)
    -- a reserved take counts its tokens at its place: the whole burst
    if wait > 0 then used = points end
    return used, ttl, function()
      if not valid then redis.call('DEL', k) end
      redis.call('HSET', k, 'r', r, 'n', n)
      redis.call('PEXPIRE', k, ttl)
    end, wait
  end
  local ttl = math.ceil((ahead - (points - cost) * d) / rate / 1000)
  -- a bucket holds at most its burst, and the places reserved ahead
  local full = math.ceil(points * window / rate) + md
  if ttl > full then ttl = full end
  return points + 1, ttl, false, 0
end

-- concurrent takes a slot of a concurrency layer: a sorted set of the
-- requests in flight, each member's score its lease end on Redis's clock (in
-- milliseconds); slots whose lease ended count no more and are dropped when
-- the key is written. The count is the slots held with the request, the
-- reset its lease; a refusal's reset is a second away.
local function concurrent(k, points, lease, member, now)
  local ms = math.floor(now / 1000)
  local held = read('ZCOUNT', k, '(' .. ms, '+inf')
  local valid = held ~= false
  if not valid then held = 0 end
  if held + 1 > points then return held + 1, 1000, false end
  return held + 1, lease, function()
    if not valid then redis.call('DEL', k) end
    redis.call('ZREMRANGEBYSCORE', k, '-inf', ms)
    redis.call('ZADD', k, ms + lease, member)
    redis.call('PEXPIRE', k, lease)
  end
end

local all = ARGV[1] == '1'
local cost = tonumber(ARGV[2])
local out, writes, charged, refused, now, longest = {}, {}, {}, false, false, 0
for i = 1, #KEYS do
  local points = tonumber(ARGV[4 * i - 1])
  local window = tonumber(ARGV[4 * i])
  local algorithm = ARGV[4 * i + 1]
  local check = string.byte(algorithm, 1) == 99
  if check then algorithm = string.sub(algorithm, 2) end
  local dry = string.byte(algorithm, 1) == 100
  if dry then algorithm = string.sub(algorithm, 2) end
  local md, nk, nlen = string.find(algorithm, 'w', 1, true), false, 0
  if md then
    md, algorithm = string.sub(algorithm, md + 1), string.sub(algorithm, 1, md - 1)
    local at, len = string.match(md, 'n(%d+):(%d+)$')
    local stem = at and string.match(KEYS[i], '^(.*:)%d+$')
    if stem then
      nk, nlen = stem .. at, tonumber(len)
    end
    md = tonumber(string.match(md, '^%d+'))
  else
    md = 0
  end
  local block, blocked = string.find(algorithm, 'b', 1, true), 0
  if block then
    block, algorithm = tonumber(string.sub(algorithm, block + 1)), string.sub(algorithm, 1, block - 1)
    blocked = redis.call('PTTL', KEYS[i] .. ':block')
  end
  local count, ttl, write, incremented, wait
  if blocked > 0 and not dry then
    count, ttl, write = points + 1, blocked, false
  elseif algorithm == '2' then
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    count, ttl, write, wait = bucket(KEYS[i], points, window, tonumber(ARGV[4 * i + 2]), cost, now, check, md)
  elseif algorithm == '3' then
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    count, ttl, write = concurrent(KEYS[i], points, window, ARGV[4 * i + 2], now)
  elseif algorithm == '1' then
    count, ttl, write, wait = sliding(KEYS[i], points, window, cost, check, md)
  else
    count, ttl, write, incremented, wait = fixed(KEYS[i], points, window, cost, check, tonumber(ARGV[4 * i + 2]), md, nk, nlen)
  end
  if wait and wait > longest then longest = wait end
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
if longest > 0 and not refused then
  out[#out + 1] = longest
  return out
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
// A negative cost is an outage's payment (owed.go) or a reported cost beyond
// a reservation (spend.go): it adds to the keys, whatever their points; a
// token bucket that is gone or full is charged from now, a sliding key that
// holds only the window before starts the current one with it, and a fixed or
// sliding key that is gone (Redis restarted empty, its window ended) is
// created with the charge when ARGV[4n+1+i], after the n layers' arguments,
// gives the milliseconds left in its window (a sliding key then lives one
// window more, as takeScript's do; a calendar key lives what is left of its
// period and KeyGrace, as takeScript's do); the refunds of requests send no
// such argument.
//
// A concurrency layer's key gives back the request's slot, its member
// (ARGV[4i+1]): the release after the response (concurrency.go).
//
// KEYS: one key per layer. ARGV[1]: the cost. ARGV[4i-2] to ARGV[4i+1]: the
// layer's arguments, as takeScript reads them from ARGV[4i-1] (a "d" before
// the algorithm and a "b<ms>" after it change nothing here).
// Returns the number of keys given back to, as a one-integer array.
var refundScript = luaRead + luaGrace + `
local cost = tonumber(ARGV[1])
local given, now = 0, false
for i = 1, #KEYS do
  local k = KEYS[i]
  local algorithm = ARGV[4 * i]
  if string.byte(algorithm, 1) == 100 then algorithm = string.sub(algorithm, 2) end
  local delayed = string.find(algorithm, 'w', 1, true)
  if delayed then algorithm = string.sub(algorithm, 1, delayed - 1) end
  local block = string.find(algorithm, 'b', 1, true)
  if block then algorithm = string.sub(algorithm, 1, block - 1) end
  if algorithm == '2' then
    local v = read('HMGET', k, 'r', 'n')
    local r, n = false, false
    if v and v[1] and v[2] then
      r, n = tonumber(v[1]), tonumber(v[2])
    end
    if (r and n) or cost < 0 then
      if not now then
        local clock = redis.call('TIME')
        now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
      end
      local d = tonumber(ARGV[4 * i - 1]) * 1000
      local rate = tonumber(ARGV[4 * i + 1])
      if not (r and n) or (cost < 0 and (r - now) * rate + n * d < 0) then
        r, n = now, 0
      end
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
  elseif algorithm == '3' then
    given = given + redis.call('ZREM', k, ARGV[4 * i + 1])
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
    local pttl = c and cost < 0 and algorithm == '1' and redis.call('PTTL', k)
    if pttl and pttl > 0 and pttl <= tonumber(ARGV[4 * i - 1]) then
      -- a sliding key that holds only the window before: the addition
      -- starts the current window, as takeScript's sliding write does
      redis.call('HSET', k, 'c', -cost, 'p', c)
      redis.call('PEXPIRE', k, pttl + tonumber(ARGV[4 * i - 1]))
      given = given + 1
    elseif c and (c > 0 or cost < 0) then
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
        -- a calendar key (its calendar's longest period given) lives as
        -- takeScript's fixed makes it: the period's rest and the grace
        if tonumber(ARGV[4 * i + 1]) > 0 then ttl = tonumber(ARGV[4 * i - 1]) + grace end
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
	algoFixed        = redisresp.Bulk("0")
	algoSliding      = redisresp.Bulk("1")
	algoBucket       = redisresp.Bulk("2")
	algoConcurrency  = redisresp.Bulk("3")
	argNoRate        = redisresp.Bulk("0")
)

// CostArg encodes a request's cost, ARGV[2] of takeScript.
func CostArg(cost int64) string {
	if cost == 1 {
		return argCostOne
	}

	return redisresp.Bulk(strconv.FormatInt(cost, 10))
}

// Encode sets l's script arguments (scripts.go) for spec, the rule l was
// made from (rule.NewLayer): points, window, algorithm and a token
// bucket's rate, a block, the dry-run flag and a calendar's tail.
func Encode(l *rule.Layer, spec config.Rule) {
	rate := l.Refill
	spec.Points = limit.Capacity(spec.Algorithm, spec.Points, spec.Burst) // a token bucket's points are its burst

	ms := int64(spec.Duration / time.Millisecond)
	head := redisresp.Bulk(strconv.FormatInt(spec.Points, 10)) + redisresp.Bulk(strconv.FormatInt(ms, 10))
	e := rediscall.Encoding{RedisArgs: head + algoFixed + argNoRate, MaxTTL: ms}

	switch {
	case spec.Algorithm == limit.Sliding:
		e.RedisArgs = head + algoSliding + argNoRate
		e.MaxTTL = 2 * ms
	case spec.Algorithm == limit.TokenBucket:
		e.RedisArgs = head + algoBucket + redisresp.Bulk(strconv.FormatInt(rate, 10))
		e.MaxTTL = (spec.Points*ms+rate-1)/rate + 1
	case spec.Algorithm == limit.Concurrency:
		e = concurrencyEncoding(head, ms)
	case spec.Calendar != 0:
		// A calendar key names its period: the fourth argument, the
		// calendar's longest period, bounds its life (takeScript's fixed).
		e.RedisArgs = head + algoFixed + redisresp.Bulk(strconv.FormatInt(ms, 10))
	}

	if spec.BlockDuration > 0 {
		e.RedisArgs, e.MaxTTL = withBlock(e.RedisArgs, e.MaxTTL, int64(spec.BlockDuration/time.Millisecond))
	}

	if spec.DryRun {
		e.RedisArgs = flagArgs(e.RedisArgs, "d")
	}

	if spec.MaxDelay > 0 { // 0 in dry run (config.Rule.MaxDelay)
		e.RedisArgs, e.MaxTTL = withDelay(e.RedisArgs, e.MaxTTL, int64(spec.MaxDelay/time.Millisecond))
	}

	if spec.Calendar != 0 {
		e.RedisTail = RedisTail(e.RedisArgs)
	}

	l.Encoding = &e
}

// concurrencyEncoding is a concurrency layer's script arguments of head
// (points and lease): the algorithm, and a per-request member that the
// store adds to each call (LeaseArgs). A refusal's reset is a second away.
func concurrencyEncoding(head string, ms int64) rediscall.Encoding {
	e := rediscall.Encoding{RedisArgs: head + algoConcurrency, MaxTTL: ms}
	if e.MaxTTL < memstore.RetryConcurrency/NsPerMillisecond {
		e.MaxTTL = memstore.RetryConcurrency / NsPerMillisecond
	}

	e.RedisTail = redisresp.Bulk("") // marks a layer whose call arguments vary (EncodeCall)

	return e
}

// withBlock adds a block of blockMs to a layer's script arguments: its
// algorithm, the third argument, gets the suffix "b<blockMs>" (takeScript),
// and a refusal may report the block's end.
func withBlock(args string, maxTTL, blockMs int64) (string, int64) {
	start, value, size := algorithmArg(args)

	if blockMs > maxTTL {
		maxTTL = blockMs
	}

	return args[:start] + redisresp.Bulk(args[value:value+size]+"b"+strconv.FormatInt(blockMs, 10)) + args[value+size+2:], maxTTL
}

// withDelay adds a maxDelay of delayMs to a layer's algorithm ("0w900",
// after a block's "b<ms>"): the script reserves a place that far ahead,
// whose reset is that much later than the window's.
func withDelay(args string, maxTTL, delayMs int64) (string, int64) {
	start, value, size := algorithmArg(args)

	return args[:start] + redisresp.Bulk(args[value:value+size]+"w"+strconv.FormatInt(delayMs, 10)) + args[value+size+2:], maxTTL + delayMs
}

// algorithmArg finds a layer's algorithm in its script arguments, the third
// one: it returns start, value and size, where args[start:] is
// "$<size>\r\n<algorithm>\r\n..." and the algorithm is args[value:value+size].
func algorithmArg(args string) (int, int, int) {
	start := 0
	for n := 0; n < 2; n++ {
		j := strings.Index(args[start:], "\r\n")
		skip, _ := strconv.Atoi(args[start+1 : start+j])
		start += j + 2 + skip + 2
	}

	j := strings.Index(args[start:], "\r\n")
	size, _ := strconv.Atoi(args[start+1 : start+j])

	return start, start + j + 2, size
}

// CheckArgs is a layer's script arguments (Encode) with the check flag
// (takeScript): a countStatus route's layer as a request's plan holds it.
func CheckArgs(args string) string {
	return flagArgs(args, "c")
}

// flagArgs is a layer's script arguments with flag prefixed to its
// algorithm, the third argument (takeScript: "c" check-only, "d" dry run).
func flagArgs(args, flag string) string {
	start, value, size := algorithmArg(args)

	return args[:start] + "$" + strconv.Itoa(size+len(flag)) + "\r\n" + flag + args[value:]
}

var ErrBadReply = errors.New("unexpected reply from the rate-limit script")

// takeRedis is the script every redisStore runs, refundRedis its refund.
var (
	takeRedis   = redisresp.NewScript(TakeScript)
	refundRedis = redisresp.NewScript(refundScript)
)

// takeCall is takeScript's call head for n layers: n keys, then ARGV[1],
// ARGV[2] and 4 arguments per layer.
func takeCall(n int) redisresp.Call {
	return takeRedis.Call(n, 5*n+2)
}

// EncodeCall encodes a script call's keys and arguments, but for its head:
// the layers' keys, then mode (ARGV[1] of takeScript, none for refundScript),
// the cost and each layer's arguments. The command is encoded here, from each
// layer's pre-encoded parts: under Yaegi, a loop over arguments in the RESP
// writer costs more than the round trip.
func EncodeCall(c *rule.Charge, mode string, cost int64) string {
	keys, args := "", mode+argCostOne
	if cost != 1 {
		args = mode + CostArg(cost)
	}

	for i, l := range c.Layers {
		if l.RedisTail != "" {
			keys, args = variedCall(l, keys, args, c, i)
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

// NsPerMillisecond is int64(time.Millisecond) as an untyped constant (see
// nsPerSecond).
const NsPerMillisecond = 1000000
