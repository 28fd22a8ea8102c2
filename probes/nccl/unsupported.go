//go:build !(linux && amd64)

package nccl

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"

	"github.com/gpuctl/gpuctl/api"
)

// Options tune a Tracer.
type Options struct {
	Procs    *ProcTable
	ProcRoot string
	Buffer   int
}

// Tracer is unavailable on this platform: the probe is compiled for
// linux/amd64 only.
type Tracer struct{}

var errPlatform = fmt.Errorf("nccl tracing needs linux/amd64 (the eBPF probe reads x86-64 registers): %w", ebpf.ErrNotSupported)

// New reports that NCCL tracing is not supported here.
func New(*slog.Logger, Options) (*Tracer, error) { return nil, errPlatform }

// Records returns a closed channel.
func (t *Tracer) Records() <-chan *api.CollectiveRecord {
	c := make(chan *api.CollectiveRecord)
	close(c)
	return c
}

// Read reports that NCCL tracing is not supported here.
func (t *Tracer) Read(context.Context) (*api.CollectiveRecord, error) { return nil, errPlatform }

// AttachLibrary reports that NCCL tracing is not supported here.
func (t *Tracer) AttachLibrary(string) error { return errPlatform }

// Scan reports that NCCL tracing is not supported here.
func (t *Tracer) Scan() error { return errPlatform }

// InFlight reports that NCCL tracing is not supported here.
func (t *Tracer) InFlight() ([]*api.CollectiveRecord, error) { return nil, errPlatform }

// Lost returns 0.
func (t *Tracer) Lost() uint64 { return 0 }

// Close does nothing.
func (t *Tracer) Close() error { return nil }
