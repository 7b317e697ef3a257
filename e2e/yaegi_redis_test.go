package e2e

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// TestRedisClientsCloseUnderYaegi runs the clients' failure and Close paths
// in Yaegi, which the e2e tests reach only after a failover: a construct
// Yaegi cannot run (an untyped nil in a tuple assignment) panics there, not
// in compiled tests.
func TestRedisClientsCloseUnderYaegi(t *testing.T) {
	gp := t.TempDir()
	if err := harness.CopyPlugin(gp); err != nil {
		t.Fatal(err)
	}

	i := interp.New(interp.Options{GoPath: gp})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}

	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}

	dead := "127.0.0.1:" + strconv.Itoa(port) // free a moment ago: nothing listens

	// A server that accepts and never answers: the pool's one connection stays
	// busy, so a second call waits and gives up (Pool.dequeue).
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()

	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	for _, src := range []string{
		`import ("time"; "github.com/tierlimit/tierlimit/redisresp")`,
		`func pool() string {
			p := redisresp.NewPool(redisresp.Options{Address: "` + dead + `"})
			_, err := p.Do("PING")
			p.Close()
			return err.Error()
		}`,
		`func sentinel() string {
			s := redisresp.NewSentinel(redisresp.Options{Sentinel: &redisresp.SentinelOptions{MasterName: "m", Addresses: []string{"` + dead + `"}}})
			_, _, err := s.DoInts("*1\r\n$4\r\nPING\r\n")
			s.Close()
			return err.Error()
		}`,
		`func busy() string {
			p := redisresp.NewPool(redisresp.Options{Address: "` + mute.Addr().String() + `", PoolSize: 1,
				Timeout: 2 * time.Second, WaitTimeout: 50 * time.Millisecond})
			started := make(chan bool)
			go func() {
				started <- true
				p.Do("PING")
			}()
			<-started
			time.Sleep(200 * time.Millisecond) // the first call holds the one connection
			_, err := p.Do("PING")
			p.Close()
			return err.Error()
		}`,
		`func cluster() string {
			c := redisresp.NewCluster(redisresp.Options{Cluster: &redisresp.ClusterOptions{Addresses: []string{"` + dead + `"}}})
			_, err := c.RunInts([]redisresp.ClusterCall{{Slot: 1}})
			c.Close()
			return err.Error()
		}`,
	} {
		if _, err := i.Eval(src); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
	}

	for call, want := range map[string]string{
		"pool()":     "connection refused",
		"sentinel()": `no sentinel named the primary "m"`,
		"cluster()":  "no node answered CLUSTER SLOTS",
		"busy()":     "waiting 50ms for one of 1 connections",
	} {
		v, err := i.Eval(call)
		if err != nil {
			t.Fatalf("%s under Yaegi: %v", call, err)
		}

		if got := v.String(); !strings.Contains(got, want) {
			t.Errorf("%s = %q, want it to contain %q", call, got, want)
		}
	}
}
