//go:build linux && amd64

package netflow

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/gpuctl/gpuctl/api"
)

// LookupFunc resolves a pid to its job and rank (-1 if unknown) and says
// whether this node reports it. nccl.ProcTable.Lookup is one.
type LookupFunc func(pid uint32) (job string, rank int32, keep bool)

// Options tune a Tracer; the zero value reports every process with no job.
type Options struct {
	Lookup LookupFunc
}

// Tracer counts per-flow socket traffic until drained.
type Tracer struct {
	log    *slog.Logger
	lookup LookupFunc
	objs   netflowObjects
	links  []link.Link

	mu     sync.Mutex
	active uint32 // which flow map the programs write to
}

// New loads the socket tracepoint programs and attaches them. Errors wrap
// ebpf.ErrNotSupported where the kernel lacks a needed feature.
func New(log *slog.Logger, opts Options) (*Tracer, error) {
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones
	// do not, and there a failure here is harmless.
	memlockErr := rlimit.RemoveMemlock()
	t := &Tracer{log: log, lookup: opts.Lookup}
	if t.lookup == nil {
		t.lookup = func(uint32) (string, int32, bool) { return "", -1, true }
	}
	if err := loadNetflowObjects(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load netflow probe: verifier rejected it: %+v", ve)
		}
		return nil, fmt.Errorf("load netflow probe (needs root, or CAP_BPF and CAP_PERFMON; memlock: %v): %w", memlockErr, err)
	}
	for _, tp := range []struct {
		group, name string
		prog        *ebpf.Program
	}{
		{"sock", "sock_send_length", t.objs.SockSendLength},
		{"sock", "sock_recv_length", t.objs.SockRecvLength},
		{"tcp", "tcp_retransmit_skb", t.objs.TcpRetransmitSkb},
	} {
		l, err := link.Tracepoint(tp.group, tp.name, tp.prog, nil)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attach netflow probe to tracepoint %s:%s (is tracefs mounted at /sys/kernel/tracing?): %w", tp.group, tp.name, err)
		}
		t.links = append(t.links, l)
	}
	return t, nil
}

// Drain returns the traffic of every flow since the previous Drain (or
// since New), stamped with now. Flows of processes the lookup rejects are
// left out.
func (t *Tracer) Drain(now time.Time) ([]*api.NetFlowSample, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.active
	next := 1 - old
	if err := t.objs.FlowsActive.Put(uint32(0), next); err != nil {
		return nil, fmt.Errorf("drain flows: switch map: %w", err)
	}
	t.active = next
	flows := t.objs.Flows0
	if old == 1 {
		flows = t.objs.Flows1
	}
	// Collect keys first: deleting while iterating a hash map can restart
	// the walk and visit keys twice.
	var (
		key  netflowFlowKey
		val  netflowFlowStats
		keys []netflowFlowKey
	)
	it := flows.Iterate()
	for it.Next(&key, &val) {
		keys = append(keys, key)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("drain flows: %w", err)
	}
	out := make([]*api.NetFlowSample, 0, len(keys))
	for _, k := range keys {
		// Atomic read-and-remove: a program that races us recreates the
		// entry and its bytes come out at the next drain of this map.
		if err := flows.LookupAndDelete(k, &val); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return out, fmt.Errorf("drain flows: %w", err)
		}
		job, rank, keep := t.lookup(k.Pid)
		if !keep {
			continue
		}
		s := sample(&k, &val)
		s.TimeUnixNano = now.UnixNano()
		s.Job, s.Rank = job, rank
		out = append(out, s)
	}
	return out, nil
}

// sample converts one flow to its wire form without job, rank or time.
func sample(k *netflowFlowKey, v *netflowFlowStats) *api.NetFlowSample {
	return &api.NetFlowSample{
		Pid:         k.Pid,
		Protocol:    protocolName(k.Protocol),
		LocalAddr:   formatAddr(k.Family, k.Laddr, k.Lport),
		RemoteAddr:  formatAddr(k.Family, k.Raddr, k.Rport),
		TxBytes:     v.TxBytes,
		RxBytes:     v.RxBytes,
		Retransmits: v.Retransmits,
	}
}

// Address families as the kernel numbers them.
const (
	afInet  = 2
	afInet6 = 10
)

// formatAddr renders addr:port; IPv4-mapped IPv6 addresses print as IPv4.
func formatAddr(family uint16, raw [16]byte, port uint16) string {
	var a netip.Addr
	switch family {
	case afInet:
		a = netip.AddrFrom4([4]byte(raw[:4]))
	case afInet6:
		a = netip.AddrFrom16(raw).Unmap()
	default:
		return "family " + strconv.Itoa(int(family))
	}
	return netip.AddrPortFrom(a, port).String()
}

func protocolName(p uint16) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return "ip-proto-" + strconv.Itoa(int(p))
}

// Lost returns how many flow updates were dropped because the flow map was
// full (more than 16384 flows in one interval).
func (t *Tracer) Lost() uint64 {
	var (
		zero uint32
		vals []uint64
		sum  uint64
	)
	if err := t.objs.FlowsLost.Lookup(zero, &vals); err != nil {
		t.log.Warn("read netflow lost counter", "err", err)
		return 0
	}
	for _, v := range vals {
		sum += v
	}
	return sum
}

// Close detaches the programs and releases the kernel objects.
func (t *Tracer) Close() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	errs = append(errs, t.objs.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close netflow tracer: %w", err)
	}
	return nil
}
