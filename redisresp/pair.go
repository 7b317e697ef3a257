package redisresp

import (
	"fmt"
	"io"
	"strconv"
	"time"
)

// PairInts runs two script calls on a Cluster at once: cmdA on the node that
// serves slotA, cmdB on the node that serves slotB (each a Call's head, then
// keys of that slot alone and the arguments), both written before either
// reply is read, so that the nodes run them together and the pair takes one
// round trip of time; two calls for one node go on one connection, one
// after the other. It is the rate limiter's fast path on a Cluster, whose
// request charges global's slot and the client's: functions, not methods,
// and no goroutine (tierlimit's doc.go: frames, functions).
//
// Each call's reply is a non-negative integer, va or vb (its slice nil), or
// an array of integers, ia or ib (its integer -1), or neither: the call did
// not run (a server error: a redirection, NOSCRIPT, which RunInts follows),
// or was not sent (the slot map not known, or stale, a node down or without
// a pool yet: RunInts reads the map and makes the pools). err says a call
// was left without a reply; its node is marked down, as RunInts marks it.
func PairInts(c *Cluster, slotA int, cmdA string, slotB int, cmdB string) (int64, []int64, int64, []int64, error) {
	var pa, pb *Pool
	var ca, cb *Conn
	c.mu.Lock()
	if c.owner != nil && !c.stale && !c.closed && len(c.down) == 0 {
		pa = c.pools[c.addrs[c.owner[slotA]]]
		pb = c.pools[c.addrs[c.owner[slotB]]]
	}
	c.mu.Unlock()
	if pa == nil || pb == nil {
		return -1, nil, -1, nil, nil
	}

	pa.mu.Lock()
	if n := len(pa.idle); n > 0 && !pa.closed {
		ca = pa.idle[n-1]
		pa.idle = pa.idle[:n-1]
	}
	pa.mu.Unlock()

	cb = ca
	if pb != pa {
		cb = idleConn(pb)
	}

	var err error
	if ca == nil || cb == nil {
		if ca, cb, err = pairConns(c, pa, ca, pb, cb); err != nil {
			return -1, nil, -1, nil, err
		}
	}

	if !sendPair(ca, cmdA, cb, cmdB, time.Now().Add(c.opts.Timeout)) {
		return -1, nil, -1, nil, pairUnsent(c, pa, ca, pb, cb)
	}

	va, ia := recvInts(ca)
	vb, ib := recvInts(cb)

	if va < 0 || vb < 0 {
		return va, ia, vb, ib, pairEnd(c, pa, ca, pb, cb)
	}

	pa.mu.Lock()
	if !pa.closed && pa.waiting == 0 {
		pa.idle = append(pa.idle, ca)
		ca = nil
	}
	pa.mu.Unlock()

	if ca != nil {
		giveBack(pa, ca)
	}

	if pb != pa {
		giveBack(pb, cb)
	}

	return va, ia, vb, ib, nil
}

// idleConn takes an idle connection of p, or returns nil, as ScriptInts
// takes one.
func idleConn(p *Pool) *Conn {
	var c *Conn

	p.mu.Lock()
	if n := len(p.idle); n > 0 && !p.closed {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()

	return c
}

// giveBack returns c to p, idle at once when it is sound and nobody waits,
// as ScriptInts returns one; through put otherwise.
func giveBack(p *Pool, c *Conn) {
	p.mu.Lock()
	if c.err == nil && !p.closed && p.waiting == 0 {
		p.idle = append(p.idle, c)
		p.mu.Unlock()

		return
	}
	p.mu.Unlock()

	p.put(c)
}

// pairConns waits for the connections that were not idle (nil), taking
// them in address order, as RunInts does (clusterNodes): a caller holding
// one node's connection while waiting for another's must not wait for one
// that holds them the other way round. On an error every connection taken
// is given back.
func pairConns(c *Cluster, pa *Pool, ca *Conn, pb *Pool, cb *Conn) (*Conn, *Conn, error) {
	if pa == pb {
		conn, err := waitConn(c, pa, nil)
		return conn, conn, err
	}

	var err error

	if pb.opts.Address < pa.opts.Address {
		// Held out of order: given back, then taken again in order.
		if ca != nil {
			giveBack(pa, ca)
			ca = nil
		}

		if cb, err = waitConn(c, pb, cb); err == nil {
			ca, err = waitConn(c, pa, nil)
		}
	} else if ca, err = waitConn(c, pa, ca); err == nil {
		cb, err = waitConn(c, pb, cb)
	}

	if err != nil {
		if ca != nil {
			giveBack(pa, ca)
		}

		if cb != nil {
			giveBack(pb, cb)
		}

		return nil, nil, err
	}

	return ca, cb, nil
}

// waitConn returns conn, or when it is nil a connection of p, waiting for
// one; a node whose connection cannot be had is marked down.
func waitConn(c *Cluster, p *Pool, conn *Conn) (*Conn, error) {
	if conn != nil {
		return conn, nil
	}

	conn, err := p.get()
	if err != nil {
		c.markDown(p.opts.Address, err)
		return nil, err
	}

	return conn, nil
}

// sendPair writes cmdA to ca and cmdB to cb (one connection or two) within
// deadline, and reports whether both went (sendCmd).
func sendPair(ca *Conn, cmdA string, cb *Conn, cmdB string, deadline time.Time) bool {
	if ca.err == nil && cb.err == nil && ca.nc.SetDeadline(deadline) == nil && cb.nc.SetDeadline(deadline) == nil {
		if _, err := io.WriteString(ca.nc, cmdA); err == nil {
			if _, err = io.WriteString(cb.nc, cmdB); err == nil {
				return true
			}

			return sendCmd(cb, deadline, cmdB) // a late write, or the failure's
		}
	}

	return sendCmd(ca, deadline, cmdA) && sendCmd(cb, deadline, cmdB)
}

// sendCmd writes cmd to c within deadline, and reports whether it went. A
// write that timed out having sent nothing goes once more (Conn.late); a
// failure closes c.
func sendCmd(c *Conn, deadline time.Time, cmd string) bool {
	if c.err != nil {
		return false
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		c.failed("setting redis deadline", err)
		return false
	}

	_, err := io.WriteString(c.nc, cmd)
	if err != nil && c.late(err, rescueGrace) {
		_, err = io.WriteString(c.nc, cmd)
	}

	if err != nil {
		c.failed("writing redis command", err)
		return false
	}

	return true
}

// recvInts reads the reply of a command sendCmd wrote, as connInts reads
// it: a non-negative integer as n, an array's integers, or neither (n -1,
// nil), c.err or c.serverErr then set.
func recvInts(c *Conn) (int64, []int64) {
	if c.err != nil {
		return -1, nil
	}

	b, err := c.rd.br.ReadSlice('\n')
	if err != nil || len(b) < 4 || b[0] != KindInteger || b[len(b)-2] != '\r' {
		return lateRead(c, b, err)
	}

	n, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
	if err != nil {
		return -1, c.failed("reading redis reply", badInteger(b, nil, c.rd.br.Size()))
	}

	if n < 0 {
		return -1, c.negative(n)
	}

	return n, nil
}

// pairUnsent ends a PairInts whose writes failed: a connection that may
// hold a command sent, whose reply nobody will read, is closed, and the
// node whose write failed is marked down.
func pairUnsent(c *Cluster, pa *Pool, ca *Conn, pb *Pool, cb *Conn) error {
	err := ca.err
	addr := pa.opts.Address
	if err == nil {
		err = cb.err
		addr = pb.opts.Address
	}

	c.markDown(addr, err)

	for _, conn := range []*Conn{ca, cb} {
		if conn.err == nil {
			_ = conn.fail(fmt.Errorf("abandoning a cluster call: %w", err))
		}
	}

	giveBack(pa, ca)
	if pb != pa {
		giveBack(pb, cb)
	}

	return err
}

// pairEnd ends a PairInts whose replies were not both integers: a server
// error is forgotten (the call did not run), a failed connection's node is
// marked down and its error returned.
func pairEnd(c *Cluster, pa *Pool, ca *Conn, pb *Pool, cb *Conn) error {
	var err error

	for i, conn := range []*Conn{ca, cb} {
		conn.serverErr = ""

		if conn.err != nil && err == nil {
			err = conn.err
			addr := pa.opts.Address
			if i == 1 {
				addr = pb.opts.Address
			}

			c.markDown(addr, err)
		}
	}

	giveBack(pa, ca)
	if pb != pa {
		giveBack(pb, cb)
	}

	return err
}
