package transport

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// lagProbeEvery is how often a listener sends itself a probe.
const lagProbeEvery = 50 * time.Millisecond

// lagProbe measures how far behind a listener's receive path is: every
// lagProbeEvery it sends its own socket a small datagram that is not QUIC,
// from another socket on loopback, and notes when each comes out of the
// QUIC transport's read loop. A probe queues behind every packet the
// kernel holds for the socket and every one the read loop has not handed
// on, so a heartbeat received now may have been sent up to this long ago.
type lagProbe struct {
	token [16]byte     // proves a probe came from this process
	seen  atomic.Int64 // send time (unix ns) of the newest probe read back
	start time.Time
}

// startLagProbe runs the probe of tr, listening on udp, until ctx ends.
// A probe that cannot run is logged once and reports no lag.
func startLagProbe(ctx context.Context, tr *quic.Transport, udp *net.UDPConn, warn func(string, ...any)) *lagProbe {
	p := &lagProbe{start: time.Now()}
	rand.Read(p.token[:])
	to := *udp.LocalAddr().(*net.UDPAddr)
	if to.IP == nil || to.IP.IsUnspecified() {
		to.IP = net.IPv4(127, 0, 0, 1)
		if udp.LocalAddr().(*net.UDPAddr).IP.To4() == nil && udp.LocalAddr().(*net.UDPAddr).IP != nil {
			to.IP = net.IPv6loopback
		}
	}
	from, err := net.DialUDP("udp", nil, &to)
	if err != nil {
		warn("the receive lag probe cannot run: node heartbeats are judged without it", "err", err)
		return p
	}
	go func() {
		defer from.Close()
		t := time.NewTicker(lagProbeEvery)
		defer t.Stop()
		var b [1 + 16 + 8]byte // first byte 0: not a QUIC packet
		copy(b[1:], p.token[:])
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			binary.BigEndian.PutUint64(b[17:], uint64(time.Now().UnixNano()))
			from.Write(b[:])
		}
	}()
	go func() {
		b := make([]byte, 64)
		for {
			n, _, err := tr.ReadNonQUICPacket(ctx, b)
			if err != nil {
				return
			}
			if n != 25 || b[0] != 0 || [16]byte(b[1:17]) != p.token {
				continue
			}
			sent := int64(binary.BigEndian.Uint64(b[17:25]))
			if sent > p.seen.Load() {
				p.seen.Store(sent)
			}
		}
	}()
	return p
}

// lag is how long ago the newest probe read back was sent, less the
// probe period: 0 while the receive path keeps up, and 0 for a probe
// that never came back (it cannot run here), so a broken probe never
// stops nodes being judged.
func (p *lagProbe) lag(now time.Time) time.Duration {
	seen := p.seen.Load()
	if seen == 0 {
		return 0
	}
	return max(0, now.Sub(time.Unix(0, seen))-lagProbeEvery)
}
