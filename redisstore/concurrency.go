package redisstore

import (
	"errors"
	"math/rand"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// A concurrency layer's key in Redis is a sorted set of the requests in
// flight (TakeScript's concurrent): each request's member, unique to it
// across replicas (this process's replica id and a counter), scored by its
// lease end on Redis's clock. The release after the response removes the
// member (refundScript); a replica that dies holding slots frees them when
// their leases end, as the script drops ended members and the key expires
// with its last lease. Memory mirrors the slots this process holds in Redis
// (memstore.Mirror: its status page, metrics and fallback know them). While
// Redis is down the fallback holds slots in memory and owes Redis nothing
// for them: they are released anyway.

// replica names this process in the members it adds; leases counts them.
var (
	replica = strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(rand.Int63(), 36)
	leases  int64
)

// leaseOf is the member that names c's slots, made the first time one of
// its concurrency layers is encoded, and given to the charges c is a part
// of (a part of a part: the slots of a synced store's request that a
// costFrom route also charges, slots.go), up to the request's own.
func leaseOf(c *rule.Charge) string {
	if c.Lease == "" {
		c.Lease = replica + ":" + strconv.FormatInt(atomic.AddInt64(&leases, 1), 10)
		for up := c.Parent; up != nil && up.Lease == ""; up = up.Parent {
			up.Lease = c.Lease
		}
	}

	return c.Lease
}

// variedCall adds the key and arguments of a layer whose arguments vary with
// the request (layer.RedisTail set) to a script call (EncodeCall): a
// calendar layer's, whose window is its period's rest, or a concurrency
// layer's, which ends with the request's member.
func variedCall(l *rule.Layer, keys, args string, c *rule.Charge, i int) (string, string) {
	if l.Alg != algConcurrency {
		return calendarCall(l, keys, args, c.Keys[i], calendarAt(c, l))
	}

	key := l.RedisKey + c.Keys[i]

	return keys + redisresp.Bulk(key), args + l.RedisArgs + redisresp.Bulk(leaseOf(c))
}

// releaseScript removes the request's member, ARGV[1], from each of KEYS,
// its concurrency layers' keys: the release after the response. It calls
// ZREM only (README's ACL); refundScript does the same for a refund.
const releaseScript = `for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return {#KEYS}`

// releaseRedis is the release script; releaseOne its call head for one key.
var (
	releaseRedis = redisresp.NewScript(releaseScript)
	releaseOne   = releaseRedis.Call(1, 2)
)

// oweRelease has Redis free the slots of c's lease in its concurrency
// layers when it answers again (RedisBackend.oweOnRecovery), for a give-back
// that could not reach it; a charge whose lease Redis never saw (the
// fallback admitted it) or without such layers owes nothing. A release that
// fails then leaves the slots to their leases.
func oweRelease(s *RedisStore, c *rule.Charge) {
	if c.Lease == "" || !anyRedisSlot(c) {
		return
	}

	s.Backend.oweOnRecovery(func() { _ = releaseInRedis(s, c) })
}

// anyRedisSlot reports whether one of c's layers is a concurrency layer
// counted in Redis.
func anyRedisSlot(c *rule.Charge) bool {
	for _, l := range c.Layers {
		if l.Alg != algConcurrency || l.Memory {
			continue
		}

		return true
	}

	return false
}

// releaseInRedis runs the release script for c's concurrency layers counted
// in Redis.
func releaseInRedis(s *RedisStore, c *rule.Charge) error {
	member := redisresp.Bulk(c.Lease)
	keys, n := "", 0

	var calls []redisresp.ClusterCall

	for i, l := range c.Layers {
		if l.Alg != algConcurrency || l.Memory {
			continue
		}

		if cl := s.Backend.cluster; cl != nil {
			key := ClusterKey(l, c.Keys[i])
			calls = append(calls, redisresp.ClusterCall{Slot: redisresp.Slot(key), Call: releaseOne, Encoded: redisresp.Bulk(key) + member})

			continue
		}

		keys += redisresp.Bulk(l.RedisKey + c.Keys[i])
		n++
	}

	if calls != nil {
		_, err := s.Backend.cluster.RunInts(calls)
		return err
	}

	if n == 0 {
		return nil
	}

	call := releaseOne
	if n > 1 {
		call = releaseRedis.Call(n, n+1)
	}

	_, serverErr, err := call.RunIntsOn(s.Backend.Pool, keys+member)
	if err == nil && serverErr != "" {
		err = errors.New("running the release script: " + serverErr)
	}

	return err
}
