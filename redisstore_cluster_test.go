package tierlimit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

func TestClusterKeysShareASlotPerClientAndPrincipal(t *testing.T) {
	mk := func(name string, kind int) *layer {
		return &layer{Limits: limits{Name: name, KeyKind: kind, ConstKey: "global"}, RedisEncoding: redisEncoding{RedisKey: "ratelimit:mw:" + name + ":"}}
	}

	ip, login, byPrincipal, global := mk("ip", keyOfClient), mk("login", keyOfClient), mk("upload", keyOfPrincipalElseClient), mk("global", keyOfConst)

	if k := redisstore.ClusterKey(ip, keyFor(ip, "198.51.100.7", "", nil)); k != "ratelimit:mw:ip:{198.51.100.7}" {
		t.Fatalf("ip key %q", k)
	}

	anon := redisstore.ClusterKey(byPrincipal, keyFor(byPrincipal, "198.51.100.7", "", nil))
	if redisresp.Slot(anon) != redisresp.Slot(redisstore.ClusterKey(ip, keyFor(ip, "198.51.100.7", "", nil))) ||
		redisresp.Slot(redisstore.ClusterKey(login, keyFor(login, "198.51.100.7", "", nil))) != redisresp.Slot(anon) {
		t.Fatalf("one client's layers in different slots: %q", anon)
	}

	if k := redisstore.ClusterKey(byPrincipal, keyFor(byPrincipal, "198.51.100.7", "alice", nil)); k != "ratelimit:mw:upload:{alice}" {
		t.Fatalf("principal key %q", k)
	}

	if k := redisstore.ClusterKey(global, keyFor(global, "198.51.100.7", "alice", nil)); k != "ratelimit:mw:global:{global}" {
		t.Fatalf("global key %q", k)
	}
}

// On a cluster a calendar layer's key and window are those of the period that
// holds the request's time (the instance's clock), not the wall clock's.
func TestClusterCalendarKeyFollowsTheRequestTime(t *testing.T) {
	l := &layer{Limits: limits{Name: "ip", Points: 5, KeyKind: keyOfClient, Calendar: calDay}, RedisEncoding: redisEncoding{RedisKey: "ratelimit:mw:ip:"}}
	l.RedisArgs = redisresp.Bulk("5") + redisresp.Bulk("86400000") + redisstore.AlgoFixed + redisstore.ArgNoRate
	l.RedisTail = redisstore.RedisTail(l.RedisArgs)
	now := time.Date(2026, 2, 10, 18, 0, 0, 0, time.UTC).UnixNano()

	groups := redisstore.SlotGroups(chargeOf([]*layer{l}, "198.51.100.7", "", nil, now, false), "")

	start := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC).Unix()
	if want := redisresp.Bulk("ratelimit:mw:ip:{198.51.100.7}:" + strconv.FormatInt(start, 10)); len(groups) != 1 || groups[0].Keys != want {
		t.Fatalf("keys %q, want %q", groups[0].Keys, want)
	}

	// 6 hours to the end of the day.
	if want := redisresp.Bulk("5") + redisresp.Bulk("21600000"); !strings.HasPrefix(groups[0].Args, want) {
		t.Fatalf("args %q, want the window left: %q", groups[0].Args, want)
	}
}
