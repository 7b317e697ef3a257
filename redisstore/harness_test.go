package redisstore

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// clock is a manual clock: tests move it, nothing waits for it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var storeSeq atomic.Int64

// storeHarness is the Redis store of an anonymous instance as the root
// builds it (New, and the layers rule.NewLayer, Encode and the memory
// store's Attach make: global when it is on, then ip), on a backend of its
// own, with a manual clock.
type storeHarness struct {
	clock  *clock
	store  *RedisStore
	layers []*rule.Layer
}

// newStoreHarness builds the store of the defaults on the redis-server at
// addr, with global off and ip 3 a minute unless mutate says otherwise.
func newStoreHarness(t *testing.T, addr string, mutate func(c *config.Config)) (*storeHarness, *bytes.Buffer) {
	t.Helper()

	cfg := config.Defaults()
	cfg.Store = "redis"
	cfg.Redis.Address = addr
	cfg.Redis.Timeout = "1s"
	cfg.Global.Points = 0
	cfg.IP = config.LayerConfig{Points: 3, Duration: "60s"}
	if mutate != nil {
		mutate(cfg)
	}

	s, err := config.Parse(cfg)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	h := &storeHarness{clock: &clock{now: time.Date(2026, 6, 15, 10, 0, 0, 200e6, time.UTC)}}
	memory := memstore.NewWindowStore(s.MaxTracked)

	// Global and ip, the first two built-in layers (config.Builtins).
	for i, kind := range []int{rule.KeyOfConst, rule.KeyOfClient} {
		if spec := s.Builtin[i]; spec.On() {
			l := rule.NewLayer(spec, kind)
			Encode(l, spec)
			memory.Attach(l)
			h.layers = append(h.layers, l)
		}
	}

	name := t.Name() + "-" + strconv.FormatInt(storeSeq.Add(1), 10) + "@test"
	h.store = New(ctx, s, name, memory, NewBlockList(s.MaxTracked), h.layers)
	h.store.Clock = h.clock.Now

	// A backend of its own: the shared registry could hand a later test with
	// a reused port the state of an earlier one.
	logs := &bytes.Buffer{}
	pool := redisresp.NewPool(s.Redis)
	t.Cleanup(pool.Close)
	h.store.Backend = &RedisBackend{Pool: pool, Single: pool, Address: addr, Log: logs}

	return h, logs
}

// layer is the harness's layer called name.
func (h *storeHarness) layer(name string) *rule.Layer {
	for _, l := range h.layers {
		if l.Name == name {
			return l
		}
	}

	return nil
}

// charge is a request of client to every layer of the harness at now.
func (h *storeHarness) charge(client string, now int64) *rule.Charge {
	return chargeOf(h.layers, client, now)
}

// chargeOf is a request of client to layers at now, each keyed by the
// client or its constant key (the root's chargeOf for those key kinds).
func chargeOf(layers []*rule.Layer, client string, now int64) *rule.Charge {
	keys := make([]string, len(layers))
	for i, l := range layers {
		keys[i] = client
		if l.KeyKind == rule.KeyOfConst {
			keys[i] = l.ConstKey
		}
	}

	return &rule.Charge{Layers: layers, Keys: keys, Client: client, Now: now}
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }
