package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// Forget drops a block list entry (layer.blockPrefix + key) and reports
// whether it still refused.
func (b *BlockList) Forget(id string, now int64) bool {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	reset, ok := b.Until[id]
	if !ok {
		return false
	}

	delete(b.Until, id)
	b.Size.Store(int64(len(b.Until)))

	return reset > now
}

// resetKeys are the Redis keys of key in layer l: its counter, in the form of
// the deployment (clusterKey on a cluster), and a blockDuration block's key,
// under the same hash tag: resetScript deletes every key of one call, which
// a cluster runs in one slot.
func resetKeys(s *RedisStore, l *rule.Layer, key string, now int64) []string {
	if s.Synced != nil && !unleased(l) {
		start, _ := SyncWindow(l, now)
		return []string{SyncKey(l, key, s.Backend.cluster != nil, start)}
	}

	k := l.RedisKey + key
	if s.Backend.cluster != nil {
		k = ResetClusterKey(l, key)
	}

	if l.Calendar != 0 {
		k += calendarSuffix(l, now)
	}

	if l.BlockDuration != 0 {
		return []string{k, k + ":block"}
	}

	return []string{k}
}

// ResetClusterKey is clusterKey for a bucket key as rule.KeyFor made it: a
// principal-keyed route's key of a request without a principal (ip:<addr>)
// is tagged by the address, every other by the whole key.
func ResetClusterKey(l *rule.Layer, key string) string {
	return ClusterKey(l, key)
}

// Reset deletes key's Redis keys in l and says what it found: redisCleared,
// redisAbsent, or redisUnavailable when the call failed (logged; Redis's
// back-off is left to the requests, which will find out themselves).
func (s *RedisStore) Reset(l *rule.Layer, key string, now int64) string {
	n, err := s.deleteKeys(resetKeys(s, l, key, now), s.Channel, ResetMessage(s.Name, l.Name, key))
	if err != nil {
		s.Backend.logResetFailure(err)
		return RedisUnavailable
	}

	if n > 0 {
		return RedisCleared
	}

	return RedisAbsent
}

// deleteKeys runs resetScript on keys, which share a slot, publishing
// message on channel, and returns how many existed.
func (s *RedisStore) deleteKeys(keys []string, channel, message string) (int64, error) {
	encoded := ""
	for _, k := range keys {
		encoded += redisresp.Bulk(k)
	}

	encoded += redisresp.Bulk(channel) + redisresp.Bulk(message)
	call := resetRedis.Call(len(keys), len(keys)+2)

	var ints []int64
	var serverErr string
	var err error

	if cl := s.Backend.cluster; cl != nil {
		var replies []redisresp.Reply

		replies, err = cl.RunInts([]redisresp.ClusterCall{{Slot: redisresp.Slot(keys[0]), Call: call, Encoded: encoded}})
		if err == nil && len(replies) == 1 {
			ints = replies[0].Ints
			serverErr = replies[0].ServerErr
		}
	} else {
		ints, serverErr, err = call.RunIntsOn(s.Backend.Pool, encoded)
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
func (b *RedisBackend) logResetFailure(err error) {
	line, jerr := events.RedisEventLine(events.RedisEvent{Event: "REDIS_RESET_FAILED", Severity: "error", Address: b.Address, Error: err.Error()}, time.Now().UnixNano())
	if jerr == nil {
		_, _ = b.Log.Write(line)
	}
}

// What resetReport.Redis says of the key in Redis.
const (
	RedisCleared     = "cleared"
	RedisAbsent      = "absent"
	RedisUnavailable = "unavailable"
)

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

var errNoReply = errors.New("no reply")
