package deploy

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/demo"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

var pngOut = flag.String("png", "", "write a panel of the dashboard, drawn from the real Prometheus's answers, to this PNG file")

// freePorts returns the first of n consecutive loopback TCP ports that are
// free now.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for base := 20000 + os.Getpid()%20000; base < 65000-n; base += n + 7 {
		ok := true
		var lns []net.Listener
		for p := base; p < base+n && ok; p++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports on 127.0.0.1", n)
	return 0
}

// prometheus is a Prometheus server run for one test.
type prometheus struct {
	url string
	dir string
}

// startPrometheus runs the prometheus binary with the shipped
// prometheus.yml, its scrape interval made 1 s and its target files
// naming the cluster's endpoints, and waits until it is ready.
func startPrometheus(t *testing.T, bin string, server string, nodes []string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	cfg, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	fast := strings.ReplaceAll(string(cfg), "scrape_interval: 15s", "scrape_interval: 1s")
	fast = strings.ReplaceAll(fast, "evaluation_interval: 15s", "evaluation_interval: 1s")
	if fast == string(cfg) {
		t.Fatal("prometheus.yml no longer sets scrape_interval: 15s; update this test's templating")
	}
	if err := os.MkdirAll(filepath.Join(dir, "targets"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fast), 0o644); err != nil {
		t.Fatal(err)
	}
	write("targets/gpuctl-serve.json", []group{{Targets: []string{server}, Labels: map[string]string{"cluster": "test"}}})
	write("targets/nodemon.json", []group{{Targets: nodes, Labels: map[string]string{"cluster": "test"}}})

	port := freePorts(t, 1)
	p := &prometheus{url: "http://127.0.0.1:" + strconv.Itoa(port), dir: dir}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", log)
		}
	})
	poll(t, 30*time.Second, "prometheus ready", func() error {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("prometheus exited: %v\n%s", err, log)
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	})
	return p
}

// promSeries is one series of a query's answer.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

func (s promSeries) value() float64 {
	v, _ := s.Value[1].(string)
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

// query asks Prometheus's HTTP API for expr now, or over [start, end] at
// step when step > 0.
func (p *prometheus) query(expr string, start, end time.Time, step time.Duration) ([]promSeries, error) {
	q := url.Values{"query": {expr}}
	path := "/api/v1/query"
	if step > 0 {
		path = "/api/v1/query_range"
		q.Set("start", strconv.FormatInt(start.Unix(), 10))
		q.Set("end", strconv.FormatInt(end.Unix(), 10))
		q.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	}
	resp, err := http.Get(p.url + path + "?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSeries `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", expr, body, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}

func poll(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s within %s: %v", what, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPrometheusScrapesDemo runs a real Prometheus with the shipped scrape
// configuration against a real demo cluster (server and nodemon
// processes with simulated DGX H100s, the ring trainer on two nodes) and
// asks it, through its HTTP API, what an operator's dashboard would.
func TestPrometheusScrapesDemo(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		needs.Prometheus.Skip(t, "prometheus is not installed (apt-get install prometheus): %v", err)
	}
	nodemon, gpuctl, ringtrain := testbin.Nodemon(t), testbin.Gpuctl(t), testbin.Ringtrain(t)
	opts := demo.DefaultOptions()
	opts.Nodes, opts.ComputeMS, opts.Bytes = 3, 30, "256K"
	opts.Nodemon, opts.Ringtrain, opts.DataDir = nodemon, ringtrain, t.TempDir()
	opts.MetricsBasePort = freePorts(t, opts.Nodes+1)
	if needs.EBPF.Required() {
		opts.EBPF = "required"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := demo.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	var nodes []string
	for _, n := range c.NodeNames {
		nodes = append(nodes, c.NodeMetricsAddrs[n])
	}
	begin := time.Now()
	p := startPrometheus(t, promBin, c.MetricsAddr, nodes)

	// Every target up, and scraped at least twice.
	poll(t, 30*time.Second, "two scrapes of every target", func() error {
		up, err := p.query(`count_over_time(up[1m]) >= 2 and up == 1`, time.Time{}, time.Time{}, 0)
		if err != nil {
			return err
		}
		if len(up) != len(nodes)+1 {
			return fmt.Errorf("%d of %d targets up with two scrapes: %v", len(up), len(nodes)+1, up)
		}
		return nil
	})

	// One series per GPU under dcgm-exporter's name and labels.
	util, err := p.query(`DCGM_FI_DEV_GPU_UTIL{Hostname="node-00"}`, time.Time{}, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(util) != 8 {
		t.Fatalf("DCGM_FI_DEV_GPU_UTIL{Hostname=\"node-00\"}: %d series, want 8: %v", len(util), util)
	}
	for _, l := range []string{"gpu", "UUID", "device", "modelName", "pci_bus_id", "job", "instance"} {
		if util[0].Metric[l] == "" {
			t.Errorf("GPU series lacks label %s: %v", l, util[0].Metric)
		}
	}
	if util[0].Metric["job"] != "nodemon" || util[0].Metric["exported_job"] != "" {
		t.Errorf("scrape job label %q (exported_job %q): a metric label named job would clash with it", util[0].Metric["job"], util[0].Metric["exported_job"])
	}
	// The demo job's ranks are on their GPUs, and it trains.
	poll(t, 20*time.Second, "GPUs labelled with the demo job", func() error {
		s, err := p.query(fmt.Sprintf(`count(DCGM_FI_DEV_GPU_UTIL{hpc_job=%q})`, c.JobID), time.Time{}, time.Time{}, 0)
		if err != nil {
			return err
		}
		if want := float64(opts.JobNodes * opts.RanksPerNode); len(s) != 1 || s[0].value() != want {
			return fmt.Errorf("GPUs with hpc_job=%s: %v, want %g", c.JobID, s, want)
		}
		return nil
	})
	poll(t, 30*time.Second, "the demo job's step rate above zero", func() error {
		s, err := p.query(fmt.Sprintf(`gpuctl_job_steps_per_second{hpc_job=%q}`, c.JobID), time.Time{}, time.Time{}, 0)
		if err != nil {
			return err
		}
		if len(s) != 1 || s[0].value() <= 0 {
			return fmt.Errorf("gpuctl_job_steps_per_second: %v", s)
		}
		return nil
	})
	if opts.EBPF == "required" {
		poll(t, 20*time.Second, "traced NCCL calls", func() error {
			s, err := p.query(fmt.Sprintf(`sum(gpuctl_nccl_calls_total{hpc_job=%q,op="allreduce"})`, c.JobID), time.Time{}, time.Time{}, 0)
			if err != nil {
				return err
			}
			if len(s) != 1 || s[0].value() <= 0 {
				return fmt.Errorf("gpuctl_nccl_calls_total: %v", s)
			}
			return nil
		})
	}

	// For the picture, let the job train a while before the fault, and
	// recover on another node after it.
	samples := func(n int) {
		poll(t, time.Duration(n)*2*time.Second, fmt.Sprintf("%d scrapes of the job's step", n), func() error {
			s, err := p.query(fmt.Sprintf(`count_over_time(gpuctl_job_step{hpc_job=%q}[10m])`, c.JobID), time.Time{}, time.Time{}, 0)
			if err != nil {
				return err
			}
			if len(s) != 1 || s[0].value() < float64(n) {
				return fmt.Errorf("%v", s)
			}
			return nil
		})
	}
	if *pngOut != "" {
		samples(30)
	}

	// An XID 79, injected as an operator would, is counted.
	xids := func() float64 {
		s, err := p.query(`sum(DCGM_FI_DEV_XID_ERRORS{Hostname="node-01",err_code="79"}) or vector(0)`, time.Time{}, time.Time{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return s[0].value()
	}
	before := xids()
	if out, err := exec.Command(gpuctl, "fault", "node-01", "xid79", "--config", c.Config).CombinedOutput(); err != nil {
		t.Fatalf("gpuctl fault node-01 xid79: %v\n%s", err, out)
	}
	poll(t, 20*time.Second, "DCGM_FI_DEV_XID_ERRORS increased", func() error {
		if after := xids(); after <= before {
			return fmt.Errorf("XID 79 count on node-01 %g, was %g", after, before)
		}
		return nil
	})

	// Every query of the shipped dashboard is valid PromQL for this
	// Prometheus, with Grafana's variables as Grafana would fill them.
	vars := strings.NewReplacer("$__rate_interval", "4s", "$Hostname", ".*", "$hpc_job", ".*")
	queries := dashboardQueries(t)
	var empty []string
	for _, q := range queries {
		s, err := p.query(vars.Replace(q.expr), time.Time{}, time.Time{}, 0)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
		}
		if len(s) == 0 {
			empty = append(empty, q.where+": "+q.expr)
		}
	}
	t.Logf("%d of %d dashboard queries answered with data; without data now (nothing of the kind happened yet):\n  %s",
		len(queries)-len(empty), len(queries), strings.Join(empty, "\n  "))

	if *pngOut != "" {
		samples(75)
		end := time.Now()
		if err := drawPanels(p, *pngOut, c.JobID, begin, end); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", *pngOut)
	}
}
