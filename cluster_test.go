package tierlimit

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

// clusterOfThree runs a Redis Cluster of three redis-server processes of the
// test's own, each the primary of a third of the slots, with README's ACL
// user on each, and returns their addresses and a client of each for
// checks.
func clusterOfThree(t *testing.T) ([]string, []*redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()

	var addrs []string
	var admins []*redisresp.Pool
	var buses []string

	for i := 0; i < 3; i++ {
		_, bus, _ := net.SplitHostPort(closedPort(t))
		addr, admin := startRedisServer(t, func(port string) []string {
			return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
				"--cluster-announce-ip", "127.0.0.1", "--cluster-port", bus, "--cluster-node-timeout", "1000"}
		})
		redisDo(t, admin, readmeACL(t)...)

		from, to := i*redisresp.Slots/3, (i+1)*redisresp.Slots/3-1
		redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to))

		addrs = append(addrs, addr)
		admins = append(admins, admin)
		buses = append(buses, bus)
	}

	for i := 1; i < 3; i++ {
		_, port, _ := net.SplitHostPort(addrs[i])
		redisDo(t, admins[0], "CLUSTER", "MEET", "127.0.0.1", port, buses[i])
	}

	waitUntil(t, "cluster_state:ok on the three nodes", func() bool {
		for _, admin := range admins {
			info := redisDo(t, admin, "CLUSTER", "INFO").Str
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3\r\n") {
				return false
			}
		}

		return true
	})

	return addrs, admins
}

// onCluster is a mutate of newHarness: the Redis store on the Cluster of
// addrs, as README's ACL user.
func onCluster(addrs []string) func(c *Config) {
	return func(c *Config) {
		c.Store = "redis"
		c.Redis.Cluster = &config.RedisClusterConfig{Addresses: addrs}
		c.Redis.Timeout = "2s"
		asACLUser(c)
	}
}

// scriptCallsOn is scriptCalls summed over a Cluster's nodes.
func scriptCallsOn(t *testing.T, admins []*redisresp.Pool) int64 {
	t.Helper()

	var n int64
	for _, admin := range admins {
		n += scriptCalls(t, admin)
	}

	return n
}

// TestSyncedCountingOnAClusterTakesTheSyncedPath: with global and ip in
// Redis on a Cluster, their keys in two slots, redis.syncInterval serves
// requests on syncedPath, as on one server: a request makes no Redis call
// once its counters hold leases, and the leases' calls go to each key's
// node.
func TestSyncedCountingOnAClusterTakesTheSyncedPath(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Redis.SyncInterval = "1h"
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if _, ok := h.h.(*syncedPath); !ok {
		t.Fatalf("handler %T, want syncedPath", h.h)
	}

	clients := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"}
	for _, client := range clients {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first request: %d, want 200", client, rec.Code)
		}
	}

	before := scriptCallsOn(t, admins)

	for i := 0; i < 10; i++ {
		for _, client := range clients {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("%s's request %d: %d, want 200", client, i, rec.Code)
			}
		}
	}

	if n := scriptCallsOn(t, admins) - before; n != 0 {
		t.Fatalf("40 requests on leases made %d script calls, want 0", n)
	}
}
