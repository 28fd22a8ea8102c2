// Package deploy holds what a site needs to watch gpuctl with its own
// tools: a Prometheus scrape configuration (prometheus.yml, with file_sd
// target files under targets/) and a Grafana dashboard with provisioning
// files (grafana/). Its tests check the dashboard against the metrics
// gpuctl exports and run a real Prometheus against a real demo cluster.
package deploy
