package redisstore

import (
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// TestFlagArgs: the dry-run and check flags prefix the algorithm argument,
// together as "cd" (takeScript).
func TestFlagArgs(t *testing.T) {
	l := &rule.Layer{}
	Encode(l, config.Rule{Name: "x", Points: 12, Duration: 1500e6, Algorithm: limit.Sliding, DryRun: true})
	args := l.RedisArgs
	if want := "$2\r\n12\r\n$4\r\n1500\r\n$2\r\nd1\r\n$1\r\n0\r\n"; args != want {
		t.Fatalf("dry-run args %q, want %q", args, want)
	}

	if got, want := CheckArgs(args), "$2\r\n12\r\n$4\r\n1500\r\n$3\r\ncd1\r\n$1\r\n0\r\n"; got != want {
		t.Fatalf("check args %q, want %q", got, want)
	}
}
