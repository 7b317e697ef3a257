package redisresp

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ClusterOptions name seed nodes of a Redis Cluster; the others are learnt
// from CLUSTER SLOTS.
type ClusterOptions struct {
	Addresses []string
}

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// ErrCluster: the cluster answered in a way the client cannot follow.
var ErrCluster = errors.New("redis cluster error")

var crcTable = makeCRCTable()

func makeCRCTable() []uint16 {
	t := make([]uint16, 256)

	for i := 0; i < 256; i++ {
		crc := uint16(i) << 8

		for j := 0; j < 8; j++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}

		t[i] = crc
	}

	return t
}

// Slot returns the hash slot of key: CRC16 (XMODEM) of the key, or of its
// hash tag (the text between the first "{" and the next "}", when not empty),
// modulo 16384, as Redis Cluster computes it.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}

	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[i]]
	}

	return int(crc) & (Slots - 1)
}

// ClusterCall is one script call whose keys all hash to Slot: the call's
// head and its encoded keys and arguments (see Call.RunInts).
type ClusterCall struct {
	Slot    int
	Call    Call
	Encoded string
}

// Reply is the outcome of one ClusterCall: its integers, or the server's
// error text.
type Reply struct {
	Ints      []int64
	ServerErr string
}

// Cluster is a client of a Redis Cluster. It learns which primary serves each
// slot from CLUSTER SLOTS on first use, and again when a node answers MOVED or
// a connection fails; it follows ASK (one ASKING redirect) without changing
// its map. Each node has its own Pool. No goroutines.
type Cluster struct {
	opts Options // per node; Address unused

	mu       sync.Mutex
	owner    []uint16 // by slot, index in addrs; nil until known
	addrs    []string
	pools    map[string]*Pool
	stale    bool            // a MOVED or failure said the map is out of date
	down     map[string]bool // nodes whose connection failed, until recheck finds them up or gone
	attempts int             // refreshes made, shared with callers who waited for one
	lastErr  error           // the last refresh's error
	closed   bool

	refreshing sync.Mutex
}

// NewCluster returns a client of opts.Cluster; it does no I/O.
func NewCluster(opts Options) *Cluster {
	// One assignment per field: Yaegi panics (reflect: New(nil)) on an
	// untyped nil in a tuple assignment.
	opts.Sentinel = nil
	opts.RequirePrimary = false
	opts = NewPool(opts).opts

	return &Cluster{opts: opts, pools: map[string]*Pool{}, down: map[string]bool{}}
}

// ErrSlotsNeeded is what DoInts returns on a cluster, without I/O: a call must
// say its slot (RunInts). Callers that hold a Client of any kind test for it.
var ErrSlotsNeeded = errors.New("a redis cluster call needs its slots")

// DoInts is not available on a cluster: it returns ErrSlotsNeeded.
func (c *Cluster) DoInts(string) ([]int64, string, error) {
	return nil, "", ErrSlotsNeeded
}

// Close closes every node's connections.
func (c *Cluster) Close() {
	c.mu.Lock()
	pools := c.pools
	c.pools = map[string]*Pool{}
	c.owner = nil
	c.closed = true
	c.mu.Unlock()

	for _, p := range pools {
		p.Close()
	}
}

// nodeCalls are the calls one node serves, sent on one connection.
type nodeCalls struct {
	addr string
	idx  []int // into the calls
	conn *Conn
	pool *Pool
}

// RunInts runs calls, one round trip per node involved: every node's calls
// are written (pipelined) before any reply is read. A call answered MOVED
// (the map is refreshed) or ASK is run again once where the node points.
// A script missing on a node is loaded with EVAL. The error is for failures
// that leave a call without a reply.
//
// While a node is down (its connection failed), every call fails until a
// recheck finds the node up again or no longer a primary (its replica was
// promoted): the caller falls back for the whole cluster, as for one server,
// rather than succeeding and failing by turns with the keys of each request.
func (c *Cluster) RunInts(calls []ClusterCall) ([]Reply, error) {
	if err := c.recheck(); err != nil {
		return nil, err
	}

	owner, addrs, err := c.slotMap()
	if err != nil {
		return nil, err
	}

	nodes, err := clusterNodes(calls, owner, addrs)
	if err != nil {
		return nil, err
	}

	replies := make([]Reply, len(calls))

	err = clusterExchange(c, nodes, calls, replies)

	// Redirections take connections of their own: give these back first, or
	// calls holding every connection of a pool would wait for one another.
	// After a failure, a node's connection may still hold replies it was
	// not read for; reused, it would answer the next call with this one's:
	// it is closed instead.
	for _, n := range nodes {
		if n.conn != nil {
			if err != nil && n.conn.Err() == nil {
				_ = n.conn.fail(fmt.Errorf("abandoning a cluster call: %w", err))
			}

			n.pool.put(n.conn)
			n.conn = nil
		}
	}

	if err != nil {
		return nil, err
	}

	for i := range replies {
		if replies[i].ServerErr != "" {
			if replies[i], err = c.redirect(calls[i], replies[i].ServerErr); err != nil {
				return nil, err
			}
		}
	}

	// A node went down while this call ran: fail it too, so that the caller
	// does not take its success for the cluster's recovery.
	c.mu.Lock()
	down := len(c.down)
	c.mu.Unlock()

	if down > 0 {
		return nil, fmt.Errorf("%w: a node failed meanwhile", ErrNodeDown)
	}

	return replies, nil
}

// clusterNodes groups calls by the node that serves their slot, in address
// order: a call holding one node's connection while waiting for another's
// must not wait for a call that holds them the other way round. Functions,
// not methods, from here on: under Yaegi a method call costs a
// reflect.MakeFunc round trip (tierlimit's doc.go: functions).
func clusterNodes(calls []ClusterCall, owner []uint16, addrs []string) ([]*nodeCalls, error) {
	var nodes []*nodeCalls

	for i, call := range calls {
		if call.Slot < 0 || call.Slot >= Slots {
			return nil, fmt.Errorf("%w: slot %d", ErrCluster, call.Slot)
		}

		addr := addrs[owner[call.Slot]]

		var n *nodeCalls
		for _, x := range nodes {
			if x.addr == addr {
				n = x
			}
		}

		if n == nil {
			n = &nodeCalls{addr: addr}
			nodes = append(nodes, n)
		}

		n.idx = append(n.idx, i)
	}

	sort.Slice(nodes, func(i, j int) bool { return nodes[i].addr < nodes[j].addr })

	return nodes, nil
}

// clusterExchange takes a connection of every node, writes each node's calls
// in one flush and reads their replies into replies. The connections it took
// are left in nodes for the caller to give back.
func clusterExchange(c *Cluster, nodes []*nodeCalls, calls []ClusterCall, replies []Reply) error {
	var err error

	for _, n := range nodes {
		if n.pool, err = c.pool(n.addr); err != nil {
			return err
		}

		if n.conn, err = n.pool.get(); err != nil {
			c.markDown(n.addr, err)
			return err
		}
	}

	// The call's time starts once it holds its connections, as on one server.
	deadline := time.Now().Add(c.opts.Timeout)

	for _, n := range nodes {
		for _, i := range n.idx {
			_, _ = n.conn.bw.WriteString(calls[i].Call.evalsha + calls[i].Encoded)
		}

		if err = n.conn.flush(deadline); err != nil {
			c.markDown(n.addr, err)
			return err
		}
	}

	for _, n := range nodes {
		for _, i := range n.idx {
			ints, serverErr, err := n.conn.readInts()
			if err != nil {
				c.markDown(n.addr, err)
				return err
			}

			replies[i] = Reply{Ints: ints, ServerErr: serverErr}
		}
	}

	return nil
}

// ErrNodeDown: a cluster node's connection failed and it has not answered
// since, nor been replaced.
var ErrNodeDown = errors.New("redis cluster node down")

// markDown records that addr's connection failed (not a pool exhausted by
// load) and that the map may be out of date.
func (c *Cluster) markDown(addr string, err error) {
	c.mu.Lock()
	c.stale = true

	if !errors.Is(err, ErrPoolTimeout) {
		c.down[addr] = true
	}
	c.mu.Unlock()
}

// recheck, while nodes are down, refreshes the map and dials each down node
// that the map still names as a primary; it returns an error while one of
// them does not answer. It runs only while nodes are down, which the caller
// (the rate limiter's back-off) turns into one call per back-off period.
func (c *Cluster) recheck() error {
	c.mu.Lock()
	var down []string
	for addr := range c.down {
		down = append(down, addr)
	}
	seen := c.attempts
	c.mu.Unlock()

	if len(down) == 0 {
		return nil
	}

	_, addrs, err := c.refresh(seen, nil, nil)
	if err != nil {
		return err
	}

	for _, addr := range down {
		primary := false
		for _, a := range addrs {
			primary = primary || a == addr
		}

		if primary {
			opts := c.opts
			opts.Address, opts.PoolSize = addr, 1
			p := NewPool(opts)
			conn, derr := p.get()

			if derr == nil {
				p.put(conn)
			}

			p.Close()

			if derr != nil {
				return fmt.Errorf("%w: %s: %s", ErrNodeDown, addr, derr.Error())
			}
		}

		c.mu.Lock()
		delete(c.down, addr)
		c.mu.Unlock()
	}

	return nil
}

// redirect follows MOVED (to the node named, refreshing the map on the next
// call) and ASK (to the node named, after ASKING), retries TRYAGAIN (a slot
// being migrated has this call's keys on both nodes for a moment: better a
// few milliseconds than memory for a whole back-off), follows a READONLY
// once to the slot's owner in a map read at once, and loads a script a node
// lacks with EVAL. Any other server error is the call's reply.
func (c *Cluster) redirect(call ClusterCall, serverErr string) (Reply, error) {
	addr, asking := c.ownerOf(call.Slot), false
	demoted := false

	for step := 0; step < redirectLimit; step++ {
		cmd := call.Call.evalsha

		switch kind, to := redirection(serverErr); {
		case strings.HasPrefix(serverErr, "READONLY") && !demoted:
			// A primary demoted by a failover the map has not seen yet:
			// read the map now, and run the call once on the slot's owner
			// it names, if another.
			demoted = true
			owner := c.freshOwner(call.Slot)
			if owner == "" || owner == addr {
				return Reply{ServerErr: serverErr}, nil
			}

			addr = owner
			asking = false
		case kind == "MOVED":
			c.markStale()
			addr, asking = to, false
		case kind == "ASK":
			addr, asking = to, true
		case strings.HasPrefix(serverErr, "TRYAGAIN"):
			time.Sleep(tryAgainPause)
			// One assignment per variable: see e2e/yaegirules_test.go.
			addr = c.ownerOf(call.Slot)
			asking = false
		case strings.HasPrefix(serverErr, "NOSCRIPT"):
			cmd = call.Call.eval
		default:
			return Reply{ServerErr: serverErr}, nil
		}

		r, err := c.runOn(cmd+call.Encoded, addr, asking)
		if err != nil {
			c.markDown(addr, err)
		}

		if err != nil || r.ServerErr == "" {
			return r, err
		}

		serverErr = r.ServerErr
	}

	return Reply{ServerErr: serverErr}, nil
}

// A call follows at most redirectLimit redirections and retries, TRYAGAIN
// ones tryAgainPause apart: a slot migration's MIGRATE and SETSLOT take
// milliseconds.
const (
	redirectLimit = 12
	tryAgainPause = 5 * time.Millisecond
)

// redirection reads "MOVED <slot> <host:port>" and "ASK <slot> <host:port>".
func redirection(serverErr string) (string, string) {
	f := strings.Fields(serverErr)
	if len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
		return f[0], f[2]
	}

	return "", ""
}

// freshOwner reads the slot map again and returns slot's owner in it, or ""
// when the map cannot be read.
func (c *Cluster) freshOwner(slot int) string {
	c.mu.Lock()
	attempts := c.attempts
	c.mu.Unlock()

	owner, addrs, err := c.refresh(attempts, nil, nil)
	if err != nil || owner == nil {
		return ""
	}

	return addrs[owner[slot]]
}

func (c *Cluster) ownerOf(slot int) string {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.owner == nil {
		return ""
	}

	return c.addrs[c.owner[slot]]
}

// runOn runs one encoded call on addr, after ASKING when asking.
func (c *Cluster) runOn(cmd, addr string, asking bool) (Reply, error) {
	if addr == "" {
		return Reply{}, fmt.Errorf("%w: no node for the slot", ErrCluster)
	}

	p, err := c.pool(addr)
	if err != nil {
		return Reply{}, err
	}

	conn, err := p.get()
	if err != nil {
		return Reply{}, err
	}
	defer p.put(conn)

	if asking {
		_, _ = conn.bw.WriteString("*1\r\n$6\r\nASKING\r\n")
	}

	_, _ = conn.bw.WriteString(cmd)

	if err := conn.flush(time.Now().Add(c.opts.Timeout)); err != nil {
		return Reply{}, err
	}

	if asking {
		line, err := conn.rd.line()
		if err != nil {
			return Reply{}, conn.fail(err)
		}

		if string(line) != "+OK" {
			return Reply{}, conn.fail(fmt.Errorf("%w: ASKING answered %q", ErrUnexpected, truncate(line)))
		}
	}

	ints, serverErr, err := conn.readInts()

	return Reply{Ints: ints, ServerErr: serverErr}, err
}

// pool returns addr's pool, creating it.
// SlotPool returns the pool of the node that serves slot, as the slot map
// last read says: a script call whose keys all hash to slot runs on it with
// ScriptInts, and a MOVED or ASK reply (an ErrServer) tells the caller to
// take RunInts, which follows redirections and reads the map again.
func SlotPool(c *Cluster, slot int) (*Pool, error) {
	owner, addrs, err := c.slotMap()
	if err != nil {
		return nil, err
	}

	if slot < 0 || slot >= len(owner) || int(owner[slot]) >= len(addrs) {
		return nil, fmt.Errorf("%w: no node serves slot %d", ErrNodeDown, slot)
	}

	return c.pool(addrs[owner[slot]])
}

func (c *Cluster) pool(addr string) (*Pool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.closed {
		return nil, ErrClosed
	}

	p := c.pools[addr]
	if p == nil {
		opts := c.opts
		opts.Address = addr
		p = NewPool(opts)
		c.pools[addr] = p
	}

	return p, nil
}

// DropIdle closes the idle connections to every node (Pool.DropIdle).
func (c *Cluster) DropIdle() {
	c.mu.Lock()
	var pools []*Pool
	for _, p := range c.pools {
		pools = append(pools, p)
	}
	c.mu.Unlock()

	for _, p := range pools {
		p.DropIdle()
	}
}

func (c *Cluster) markStale() {
	c.mu.Lock()
	c.stale = true
	c.mu.Unlock()
}

// slotMap returns the map, refreshing it first when it is unknown or stale.
func (c *Cluster) slotMap() ([]uint16, []string, error) {
	c.mu.Lock()
	owner, addrs, stale, attempts, closed := c.owner, c.addrs, c.stale, c.attempts, c.closed
	c.mu.Unlock()

	if closed {
		return nil, nil, ErrClosed
	}

	if owner != nil && !stale {
		return owner, addrs, nil
	}

	return c.refresh(attempts, owner, addrs)
}

// refresh asks the known nodes, then the seeds, for CLUSTER SLOTS. Callers
// that waited for another refresh take its outcome. While a refresh fails,
// a stale map is still used: MOVED replies keep the calls right.
func (c *Cluster) refresh(seen int, owner []uint16, addrs []string) ([]uint16, []string, error) {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()

	c.mu.Lock()
	if c.attempts != seen {
		owner, addrs, err := c.owner, c.addrs, c.lastErr
		c.mu.Unlock()

		if owner != nil {
			return owner, addrs, nil
		}

		return nil, nil, err
	}

	candidates := c.candidates()
	c.mu.Unlock()

	newOwner, newAddrs, err := c.askAny(candidates)

	c.mu.Lock()
	c.attempts++

	if err != nil {
		c.lastErr = err
		c.mu.Unlock()

		if owner != nil {
			return owner, addrs, nil
		}

		return nil, nil, err
	}

	gone := c.install(newOwner, newAddrs)
	c.mu.Unlock()

	for _, p := range gone {
		p.Close()
	}

	return newOwner, newAddrs, nil
}

// candidates lists the nodes to ask for the map: known nodes first, the seeds
// next, nodes that just failed last. Under c.mu.
func (c *Cluster) candidates() []string {
	var candidates, last []string

	for _, a := range append(append([]string(nil), c.addrs...), c.opts.Cluster.Addresses...) {
		if c.down[a] {
			last = append(last, a)
		} else {
			candidates = append(candidates, a)
		}
	}

	return append(candidates, last...)
}

// askAny asks candidates for CLUSTER SLOTS in turn, until one answers.
func (c *Cluster) askAny(candidates []string) ([]uint16, []string, error) {
	var errs []string

	for _, addr := range candidates {
		owner, addrs, err := c.askSlots(addr)
		if err == nil {
			return owner, addrs, nil
		}

		errs = append(errs, err.Error())
	}

	return nil, nil, fmt.Errorf("%w: no node answered CLUSTER SLOTS: %s", ErrCluster, strings.Join(errs, "; "))
}

// install makes owner and addrs the map, and returns the pools of nodes it no
// longer names, for the caller to close once it released c.mu. Under c.mu.
func (c *Cluster) install(owner []uint16, addrs []string) []*Pool {
	c.owner = owner
	c.addrs = addrs
	c.stale = false
	c.lastErr = nil

	var gone []*Pool

	for addr, p := range c.pools {
		keep := false
		for _, a := range addrs {
			keep = keep || a == addr
		}

		if !keep {
			gone = append(gone, p)
			delete(c.pools, addr)
		}
	}

	return gone
}

// askSlots reads CLUSTER SLOTS from addr: [[start, end, [host, port, id...],
// replicas...], ...]. An empty host means addr's.
func (c *Cluster) askSlots(addr string) ([]uint16, []string, error) {
	opts := c.opts
	opts.Address, opts.PoolSize, opts.Timeout = addr, 1, c.opts.DialTimeout
	p := NewPool(opts)
	defer p.Close()

	v, err := p.Do("CLUSTER", "SLOTS")
	if err != nil {
		return nil, nil, err
	}

	if v.IsError() {
		return nil, nil, fmt.Errorf("CLUSTER SLOTS on %s: %s", addr, v.Str)
	}

	return slotOwners(v, addr)
}

// slotOwners reads a CLUSTER SLOTS reply from addr into the owner index of
// every slot and the owners' addresses; a slot without a primary is an
// error.
func slotOwners(v Value, addr string) ([]uint16, []string, error) {
	seedHost, _, _ := net.SplitHostPort(addr)
	owner := make([]uint16, Slots)
	covered := make([]bool, Slots)
	index := map[string]int{}

	var addrs []string

	for _, r := range v.Array {
		if len(r.Array) < 3 || len(r.Array[2].Array) < 2 {
			return nil, nil, fmt.Errorf("%w: CLUSTER SLOTS entry %s", ErrCluster, r.String())
		}

		start, end := int(r.Array[0].Int), int(r.Array[1].Int)
		node := r.Array[2].Array

		host := node[0].Str
		if host == "" || host == "?" {
			host = seedHost
		}

		a := net.JoinHostPort(host, strconv.FormatInt(node[1].Int, 10))

		i, ok := index[a]
		if !ok {
			i = len(addrs)
			index[a] = i
			addrs = append(addrs, a)
		}

		if start < 0 || end >= Slots || start > end {
			return nil, nil, fmt.Errorf("%w: slots %d-%d", ErrCluster, start, end)
		}

		for s := start; s <= end; s++ {
			owner[s] = uint16(i)
			covered[s] = true
		}
	}

	for s, ok := range covered {
		if !ok {
			return nil, nil, fmt.Errorf("%w: slot %d has no primary in CLUSTER SLOTS from %s", ErrCluster, s, addr)
		}
	}

	return owner, addrs, nil
}
