package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsHandler serves nodemon's metrics for Prometheus: the GPU
// counters under dcgm-exporter's names, gpuctl's NCCL and flow counters,
// and nodemon's own process and Go runtime figures. It answers in
// OpenMetrics when the scraper asks for it; counters named as
// dcgm-exporter names them (no _total) are then typed unknown, which
// keeps their names the same in both formats.
func (a *Agent) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.metrics, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}
