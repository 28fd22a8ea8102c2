//go:build !(linux && amd64)

package netflow

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gpuctl/gpuctl/api"
)

// LookupFunc resolves a pid to its job and rank and says whether to report it.
type LookupFunc func(pid uint32) (job string, rank int32, keep bool)

// Options tune a Tracer.
type Options struct {
	Lookup LookupFunc
}

// Tracer is unavailable on this platform: the probe is built for linux/amd64.
type Tracer struct{}

var errPlatform = fmt.Errorf("socket flow tracing needs linux/amd64: %w", ebpf.ErrNotSupported)

// New reports that flow tracing is not supported here.
func New(*slog.Logger, Options) (*Tracer, error) { return nil, errPlatform }

// Drain reports that flow tracing is not supported here.
func (t *Tracer) Drain(time.Time) ([]*api.NetFlowSample, error) { return nil, errPlatform }

// Lost returns 0.
func (t *Tracer) Lost() uint64 { return 0 }

// Close does nothing.
func (t *Tracer) Close() error { return nil }
