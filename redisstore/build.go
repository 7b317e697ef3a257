package redisstore

import (
	"context"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// What New makes once per instance: the store and each layer's keys; each
// layer's part of the script call is Encode's (scripts.go, beside the
// script that reads it).

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
