package redisstore

import (
	"context"
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

// What New and Encode make once per instance: the store, and each layer's
// part of the script call (rediscall.Encoding), which the request path
// then only concatenates.

// New makes the Redis store of an instance, with memory as its fallback
// and blocked as its block list, and encodes each layer's keys. The store's
// Clock is time.Now until the instance sets its own.
func New(ctx context.Context, cfg *config.Settings, name string, memory *memstore.WindowStore, blocked *BlockList, layers []*rule.Layer) *RedisStore {
	rs := &RedisStore{
		Prefix:  cfg.KeyPrefix + ":" + name + ":",
		Name:    name,
		Channel: ResetChannel(cfg.KeyPrefix),
		Backend: Backends.Get(ctx, cfg.Redis),
		Local:   memory,
		Blocked: blocked,
		Owed:    newOwedCounts(cfg.MaxTracked),
		Clock:   time.Now,
	}

	SetProbeKey(rs.Backend, ProbeKey(cfg.KeyPrefix))

	for _, l := range layers {
		rs.Blocks = rs.Blocks || l.BlockDuration != 0
		l.RedisKey = rs.Prefix + l.Name + ":"
		l.RedisConstKey = redisresp.Bulk(l.RedisKey + l.ConstKey)
		l.BlockPrefix = blockPrefix(l)
	}

	// A plan has at most every layer: global, one tier or plan and the routes.
	for n := 0; n <= len(layers); n++ {
		rs.Calls = append(rs.Calls, takeCall(n))
	}

	if cfg.SyncInterval > 0 {
		rs.Exact = exactBeside(rs, layers)
		rs.Synced = syncStateFor(ctx, name, rs.Backend, cfg.SyncInterval, cfg.MaxTracked, func() { ListenResets(rs) })
	}

	return rs
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
