package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Cluster is a Redis Cluster of redis-server processes on loopback: Primaries
// share the 16384 slots in equal ranges; Replicas[i] replicates Primaries[i].
type Cluster struct {
	Primaries []*Redis
	Replicas  []*Redis
	IDs       map[string]string // node id by address
}

// StartClusterNode runs one cluster-enabled redis-server whose port and bus
// port (port + 10000) are free, with a 1s node timeout.
func StartClusterNode(dir string, extra ...string) (*Redis, error) {
	for attempt := 0; attempt < 20; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}

		if port+10000 > 65535 {
			continue
		}

		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err != nil {
			continue
		} else {
			l.Close()
		}

		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"}, extra...)
		r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, args: args}

		if err = r.Start(); err == nil {
			return r, nil
		}

		if !strings.Contains(err.Error(), "Address already in use") {
			return nil, err
		}
	}

	return nil, errors.New("no free port pair for a cluster node")
}

// StartCluster starts primaries (and, for the first replicas of them, one
// replica each) under dir, assigns the slots, joins the nodes with CLUSTER
// MEET and waits until every node reports cluster_state:ok. On error the
// nodes started are stopped.
func StartCluster(dir string, primaries, replicas int, extra ...string) (c *Cluster, err error) {
	c = &Cluster{IDs: map[string]string{}}

	defer func() {
		if err != nil {
			c.Kill()
		}
	}()

	start := func(name string) (*Redis, error) {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}

		return StartClusterNode(d, extra...)
	}

	for i := 0; i < primaries; i++ {
		r, err := start("primary" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}

		c.Primaries = append(c.Primaries, r)
	}

	for i := 0; i < replicas; i++ {
		r, err := start("replica" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}

		c.Replicas = append(c.Replicas, r)
	}

	all := append(append([]*Redis(nil), c.Primaries...), c.Replicas...)

	for _, r := range all {
		v, err := r.do("CLUSTER", "MYID")
		if err != nil {
			return nil, err
		}

		c.IDs[r.Addr] = v.Str
	}

	for i, r := range c.Primaries {
		from, to := i*redisresp.Slots/primaries, (i+1)*redisresp.Slots/primaries-1
		if _, err := r.do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to)); err != nil {
			return nil, err
		}
	}

	for _, r := range all[1:] {
		if _, err := all[0].do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(r.Port)); err != nil {
			return nil, err
		}
	}

	// A replica can follow its primary once it knows it.
	for i, r := range c.Replicas {
		id := c.IDs[c.Primaries[i].Addr]

		if err := waitFor(15*time.Second, "replica "+r.Addr+" to know its primary", func() bool {
			v, err := r.do("CLUSTER", "NODES")
			return err == nil && strings.Contains(v.Str, id)
		}); err != nil {
			return nil, err
		}

		if _, err := r.do("CLUSTER", "REPLICATE", id); err != nil {
			return nil, err
		}
	}

	if err := c.WaitOK(30 * time.Second); err != nil {
		return nil, err
	}

	for _, r := range c.Replicas {
		if err := waitFor(15*time.Second, "replica "+r.Addr+" in sync", func() bool {
			v, err := r.do("ROLE")
			return err == nil && len(v.Array) >= 4 && v.Array[0].Str == "slave" && v.Array[3].Str == "connected"
		}); err != nil {
			return nil, err
		}
	}

	return c, nil
}

// Seeds returns the primaries' addresses, the seed list of a client.
func (c *Cluster) Seeds() []string {
	var seeds []string
	for _, r := range c.Primaries {
		seeds = append(seeds, r.Addr)
	}

	return seeds
}

// Nodes returns every node, primaries first.
func (c *Cluster) Nodes() []*Redis {
	return append(append([]*Redis(nil), c.Primaries...), c.Replicas...)
}

// WaitOK waits until every running node reports cluster_state:ok and knows
// every node.
func (c *Cluster) WaitOK(limit time.Duration) error {
	n := len(c.Primaries) + len(c.Replicas)

	return waitFor(limit, "cluster_state:ok on every node", func() bool {
		for _, r := range c.Nodes() {
			if !r.Running() {
				continue
			}

			v, err := r.do("CLUSTER", "INFO")
			if err != nil || !strings.Contains(v.Str, "cluster_state:ok") ||
				!strings.Contains(v.Str, "cluster_known_nodes:"+strconv.Itoa(n)+"\r\n") {
				return false
			}
		}

		return true
	})
}

// Kill stops every node.
func (c *Cluster) Kill() {
	for _, r := range c.Nodes() {
		r.Kill()
	}
}

// Running reports whether the server process is up.
func (r *Redis) Running() bool {
	if r.done == nil {
		return false
	}

	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// do runs one command on r and turns an error reply into an error.
func (r *Redis) do(args ...string) (redisresp.Value, error) {
	p := r.Client(redisresp.Options{Timeout: 5 * time.Second, PoolSize: 1})
	defer p.Close()

	v, err := p.Do(args...)
	if err == nil && v.IsError() {
		err = fmt.Errorf("%s on %s: %s", strings.Join(args, " "), r.Addr, v.Str)
	}

	return v, err
}

func waitFor(limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)

	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting %s for %s", limit, what)
		}

		time.Sleep(50 * time.Millisecond)
	}

	return nil
}
