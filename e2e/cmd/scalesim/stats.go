package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// redisDelta is what the Redis servers did between two snapshots, summed
// over the nodes, the snapshots' own INFO calls taken out.
type redisDelta struct {
	Scripts    int64   // EVALSHA and EVAL calls: the plugin's calls
	Commands   int64   // every command, those a script ran included (INFO commandstats)
	RoundTrips int64   // reads of a client's socket (INFO stats total_reads_processed): a call, or a pipeline of them
	CPU        float64 // seconds, used_cpu_user + used_cpu_sys
}

func (a redisDelta) minus(b redisDelta) redisDelta {
	return redisDelta{a.Scripts - b.Scripts, a.Commands - b.Commands, a.RoundTrips - b.RoundTrips, a.CPU - b.CPU}
}

// stats reads the nodes of a deployment: the server, or every primary of
// a cluster (the seeds are its primaries: harness.Cluster.Seeds).
type stats struct {
	pools []*redisresp.Pool
}

func newStats(addrs []string) *stats {
	st := &stats{}

	for _, a := range addrs {
		st.pools = append(st.pools, redisresp.NewPool(redisresp.Options{Address: a, Timeout: 10 * time.Second, PoolSize: 1}))
	}

	return st
}

func (st *stats) close() {
	for _, p := range st.pools {
		p.Close()
	}
}

// flush empties every node, so that a configuration starts from no key.
func (st *stats) flush() error {
	for _, p := range st.pools {
		v, err := p.Do("FLUSHALL")
		if err == nil && v.IsError() {
			err = fmt.Errorf("FLUSHALL: %s", v.Str)
		}

		if err != nil {
			return err
		}
	}

	return nil
}

// snapshot sums the nodes' counters. The INFO of a snapshot is counted by
// the next one: as a command (left out: cmdstat_info is skipped) and as a
// read (taken out here: one per node).
func (st *stats) snapshot() (redisDelta, error) {
	var d redisDelta

	for _, p := range st.pools {
		v, err := p.Do("INFO", "commandstats", "stats", "cpu")
		if err != nil {
			return d, err
		}

		if v.IsError() {
			return d, fmt.Errorf("INFO: %s", v.Str)
		}

		n := parseInfo(v.Str)
		d.Scripts += n.Scripts
		d.Commands += n.Commands
		d.RoundTrips += n.RoundTrips - 1
		d.CPU += n.CPU
	}

	return d, nil
}

// parseInfo reads INFO's commandstats (cmdstat_<name>:calls=N,...), stats
// and cpu sections.
func parseInfo(text string) redisDelta {
	var d redisDelta

	for _, line := range strings.Split(text, "\r\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}

		switch {
		case strings.HasPrefix(key, "cmdstat_"):
			calls := field(value, "calls")
			if key == "cmdstat_info" {
				continue
			}

			d.Commands += calls
			if key == "cmdstat_evalsha" || key == "cmdstat_eval" {
				d.Scripts += calls
			}
		case key == "total_reads_processed":
			d.RoundTrips, _ = strconv.ParseInt(value, 10, 64)
		case key == "used_cpu_sys" || key == "used_cpu_user":
			f, _ := strconv.ParseFloat(value, 64)
			d.CPU += f
		}
	}

	return d
}

// field is the integer value of name in "a=1,b=2".
func field(list, name string) int64 {
	for _, kv := range strings.Split(list, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}

	return 0
}
