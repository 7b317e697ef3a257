// Package rediscall holds a layer's part of the Redis store's script call
// (Encoding), RESP-encoded once by the Redis store (redisstore's Encode and
// New), which the layer (rule.Layer) points to so that the request path
// reaches it without a lookup (../doc.go: frames). It is data; redisstore
// makes and reads it.
package rediscall

// Encoding is a layer's part of the Redis script call, RESP-encoded once.
type Encoding struct {
	RedisArgs     string // points, window (ms) and algorithm
	RedisKey      string // the key up to the bucket key
	RedisConstKey string // a constant key whole
	MaxTTL        int64  // the longest reset the script may report, in ms: the window, twice for sliding
	BlockPrefix   string // the start of the layer's block list entries (redisstore's blockList)
	RedisTail     string // a calendar layer's arguments after points and window (redisstore's calendarCall)
}
