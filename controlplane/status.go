package controlplane

import (
	"context"
	"errors"
	"os"

	"github.com/gpuctl/gpuctl/api"
)

// status answers gpuctl status: which server leads, since when, and how
// the store is.
func (s *Server) status(ctx context.Context, c *call) error {
	st := statusOf(ctx, s.cfg)
	st.TelemetryShed = s.TelemetryShed()
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Status{Status: st}})
}

// TelemetryShed is the telemetry the server dropped, unapplied, because
// its ingest fell behind.
func (s *Server) TelemetryShed() *api.TelemetryShed {
	sh := s.nodes.Shed()
	return &api.TelemetryShed{Batches: sh.Batches, GpuSamples: sh.GPUSamples, Collectives: sh.Collectives, Pace: s.nodes.Pace()}
}

// statusOf is cfg.Status's answer, or, for a server on its own bbolt
// file, the server alone.
func statusOf(ctx context.Context, cfg Config) *api.StatusResponse {
	var st *api.StatusResponse
	if cfg.Status != nil {
		st = cfg.Status(ctx)
	} else {
		host, _ := os.Hostname()
		self := &api.ServerStatus{Name: host, Addr: cfg.AdvertiseAddr, Role: "single"}
		st = &api.StatusResponse{Self: self, Leader: self, Servers: []*api.ServerStatus{self}, Store: "bbolt", StoreHealthy: true}
	}
	var ro *ReadOnlyError
	if errors.As(cfg.ReadOnly.Err(), &ro) {
		st.ReadOnly, st.ReadOnlyReason, st.ReadOnlySinceUnixNano = true, ro.Reason, ro.Since.UnixNano()
	}
	return st
}
