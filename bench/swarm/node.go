package swarm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// node is one simulated nodemon: a real node identity and QUIC connection
// speaking nodemon's protocol (hello, registration, heartbeats and command
// acks on the control stream, batches on the telemetry stream), with GPUs
// and NCCL calls made up rather than measured.
type node struct {
	name string
	id   *transport.Identity
	gpus int
	// colls is how many NCCL call records each batch carries.
	colls int
	rng   *rand.Rand

	conn    *transport.Conn
	writeMu sync.Mutex
	control *transport.Stream
	tel     *transport.Stream

	seq       uint64 // NCCL sequence number
	energyMJ  uint64
	sent      *atomic.Int64 // GPU samples sent, shared by the swarm
	telemetry *atomic.Bool  // whether batches flow, shared by the swarm
	// beatGap is the longest time (ns) between two of its heartbeats
	// leaving, once telemetry flows: on a machine the generator shares
	// with the server, a node it starves is silent by its own doing.
	beatGap atomic.Int64
	// pace is the server's TelemetryPace factor (0 or 1: batchEvery).
	pace atomic.Uint32
	// paced counts the batches the node left out at the server's pace,
	// shared by the swarm.
	paced *atomic.Int64
}

// registration is what the node tells the server about itself: 8 H100s
// of 80 GiB in one NVLink domain, the heartbeat nodemon sends by default.
func (n *node) registration(interval time.Duration) *api.NodeRegistration {
	reg := &api.NodeRegistration{
		Name: n.name, Hostname: n.name, SimProfile: "dgx-h100", AgentVersion: "swarm",
		HeartbeatIntervalMs: uint32(interval / time.Millisecond),
		Labels:              map[string]string{"bench": "swarm"},
	}
	for g := 0; g < n.gpus; g++ {
		reg.Gpus = append(reg.Gpus, &api.GPUInfo{Index: uint32(g), Uuid: n.uuid(g), Model: "NVIDIA H100 80GB HBM3",
			MemTotalBytes: 80 << 30, PciBusId: fmt.Sprintf("00000000:%02X:00.0", 0x18+g), PowerLimitMw: 700000})
	}
	return reg
}

func (n *node) uuid(g int) string { return fmt.Sprintf("GPU-swarm-%s-%d", n.name, g) }

// connect dials the server from the swarm's shared socket and registers.
func (n *node) connect(ctx context.Context, d *transport.Dialer, addr string, interval time.Duration) error {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := d.DialNode(dctx, addr, n.id)
	if err != nil {
		return err
	}
	control, err := conn.OpenStream(dctx, transport.StreamControl)
	if err != nil {
		conn.Close()
		return fmt.Errorf("open control stream: %w", err)
	}
	control.SetDeadline(time.Now().Add(20 * time.Second))
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{
		Version: api.CurrentVersion(), Role: "node", Software: "gpuctl bench swarm",
		Features: []string{api.FeatureTelemetryPace}}}}); err != nil {
		conn.Close()
		return fmt.Errorf("send hello: %w", err)
	}
	var m api.ServerMessage
	if err := control.Recv(&m); err != nil {
		conn.Close()
		return fmt.Errorf("read welcome: %w", err)
	}
	if w := m.GetWelcome(); w == nil || w.GetError() != "" {
		conn.Close()
		return fmt.Errorf("server refused the node: %v", m.GetWelcome().GetError())
	}
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: n.registration(interval)}}); err != nil {
		conn.Close()
		return fmt.Errorf("send registration: %w", err)
	}
	control.SetDeadline(time.Time{})
	tel, err := conn.OpenStream(dctx, transport.StreamTelemetry)
	if err != nil {
		conn.Close()
		return fmt.Errorf("open telemetry stream: %w", err)
	}
	n.conn, n.control, n.tel = conn, control, tel
	return nil
}

// sendControl writes one message on the control stream; heartbeats and
// command acks share it.
func (n *node) sendControl(m *api.AgentMessage) error {
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	n.control.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return n.control.Send(m)
}

// run answers commands, sends a heartbeat every interval and, once the
// swarm's telemetry is on, a batch every batchEvery, each from a random
// phase (real nodes are not in step), until ctx ends or the connection
// fails. As in nodemon, telemetry has a goroutine of its own: a batch
// held up by flow control never delays a heartbeat, and the ticks it
// misses are batches dropped, not queued.
func (n *node) run(ctx context.Context, interval, batchEvery time.Duration) error {
	errs := make(chan error, 3)
	go func() { errs <- n.answer() }()
	if n.conn.Datagrams() {
		go n.drainDatagrams()
	}
	phase := time.Duration(n.rng.Int64N(int64(min(interval, batchEvery))))
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return err
	case <-time.After(phase):
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { errs <- n.stream(rctx, batchEvery) }()
	beats := time.NewTicker(interval)
	defer beats.Stop()
	datagrams := n.conn.Datagrams()
	var last time.Time
	for beat := uint64(1); ; beat++ {
		// As nodemon: by datagram, then on the control stream.
		m := &api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{
			TimeUnixNano: time.Now().UnixNano(), Seq: beat}}}
		if datagrams {
			n.conn.SendDatagram(m) // lost or not, the stream's copy follows
		}
		if err := n.sendControl(m); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if now := time.Now(); n.telemetry.Load() {
			if !last.IsZero() && int64(now.Sub(last)) > n.beatGap.Load() {
				n.beatGap.Store(int64(now.Sub(last)))
			}
			last = now
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return err
		case <-beats.C:
		}
	}
}

// stream sends a batch every batchEvery while the swarm's telemetry is on,
// or factor times less often at the server's pace (as nodemon does: the
// ticks between are batches it does not make).
func (n *node) stream(ctx context.Context, batchEvery time.Duration) error {
	t := time.NewTicker(batchEvery)
	defer t.Stop()
	for tick := uint64(0); ; tick++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if k := uint64(max(n.pace.Load(), 1)); tick%k != 0 {
			if n.telemetry.Load() {
				n.paced.Add(1)
			}
			continue
		}
		if n.telemetry.Load() {
			if err := n.sendBatch(); err != nil {
				return fmt.Errorf("telemetry: %w", err)
			}
		}
	}
}

// answer acks every command: the swarm's nodes run nothing, so each
// command succeeds at once, which makes its round trip the server's and
// the network's time alone.
func (n *node) answer() error {
	for {
		var m api.ServerMessage
		if err := n.control.Recv(&m); err != nil {
			return fmt.Errorf("control stream: %w", err)
		}
		if p := m.GetPace(); p != nil {
			n.pace.Store(p.GetFactor())
			continue
		}
		if c := m.GetCommand(); c != nil {
			if err := n.sendControl(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: &api.CommandAck{Id: c.GetId()}}}); err != nil {
				return fmt.Errorf("ack command %d: %w", c.GetId(), err)
			}
		}
	}
}

// drainDatagrams reads the server's lease renewals by datagram, which
// the swarm's nodes (running no ranks) have no use for, until the
// connection ends.
func (n *node) drainDatagrams() {
	ctx := n.conn.Context()
	for ctx.Err() == nil {
		var m api.ServerMessage
		n.conn.ReceiveDatagram(ctx, &m)
	}
}

// sendBatch sends one telemetry batch: a sample of every GPU stamped with
// the time it leaves, and the NCCL calls since the last batch.
func (n *node) sendBatch() error {
	now := time.Now().UnixNano()
	t := &api.Telemetry{Ranks: []*api.RankStatus{}, InFlight: []*api.CollectiveRecord{}}
	n.energyMJ += 650_000
	for g := 0; g < n.gpus; g++ {
		util := uint32(85 + n.rng.IntN(15))
		t.Gpus = append(t.Gpus, &api.GPUSample{
			Index: uint32(g), Uuid: n.uuid(g), TimeUnixNano: now, UtilGpuPercent: util, UtilMemPercent: util * 6 / 10,
			MemUsedBytes: 60 << 30, MemTotalBytes: 80 << 30, PowerMw: 600_000 + uint32(n.rng.IntN(80_000)),
			EnergyMj: n.energyMJ, TempC: 65 + uint32(n.rng.IntN(10)), SmClockMhz: 1980, MemClockMhz: 2619,
			NvlinkTxBytesPerSec: 40 << 30, NvlinkRxBytesPerSec: 40 << 30, PcieTxBytesPerSec: 1 << 30, PcieRxBytesPerSec: 1 << 30,
			Ecc: &api.ECCCounts{},
		})
	}
	for c := 0; c < n.colls; c++ {
		n.seq++
		t.Collectives = append(t.Collectives, &api.CollectiveRecord{
			StartUnixNano: now - int64(time.Millisecond), DurationNs: int64(900 * time.Microsecond), Pid: 4242, Tid: 4242,
			Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Count: 1 << 20, Datatype: 7, Bytes: 4 << 20, Comm: 0xc0ffee,
			Seq: n.seq, Peer: -1, Job: "swarm", Rank: int32(c % n.gpus), CommNranks: int32(n.gpus), CommRank: int32(c % n.gpus),
		})
	}
	n.tel.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := n.tel.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: t}}); err != nil {
		return err
	}
	n.sent.Add(int64(n.gpus))
	return nil
}

// close ends the node's connection, telling the server.
func (n *node) close() {
	if n.conn != nil {
		n.conn.Close()
	}
}

// errNotReady says the swarm did not come up in time.
var errNotReady = errors.New("not every node registered")
