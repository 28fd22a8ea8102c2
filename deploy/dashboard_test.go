package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/controlplane/metrics"
)

// dashboardQuery is one PromQL expression of the dashboard: a panel's
// target or a template variable's query.
type dashboardQuery struct {
	where, expr string
}

// dashboardQueries reads every PromQL expression of the shipped dashboard.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("grafana", "gpuctl.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/gpuctl.json: %v", err)
	}
	var out []dashboardQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, dashboardQuery{where: "panel " + p.Title, expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		// label_values(METRIC, LABEL) names a metric too.
		if m := regexp.MustCompile(`^label_values\(([^,]+),`).FindStringSubmatch(v.Definition); m != nil {
			out = append(out, dashboardQuery{where: "variable " + v.Name, expr: m[1]})
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	// Label lists of aggregations and vector matching.
	promLabelLists = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent      = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promKeywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression reads: the
// identifiers left once strings, label matchers, ranges and label lists
// are removed, that are not functions (followed by a parenthesis) or
// keywords.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	e = promLabelLists.ReplaceAllString(e, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if promKeywords[strings.ToLower(name)] || strings.HasPrefix(rest, "(") {
			continue
		}
		// A number's exponent (1e9) is not a name.
		if loc[0] > 0 && strings.ContainsAny(e[loc[0]-1:loc[0]], "0123456789.") {
			continue
		}
		out = append(out, name)
	}
	return out
}

func TestMetricNames(t *testing.T) {
	tests := []struct{ expr, want string }{
		{`DCGM_FI_DEV_GPU_UTIL{Hostname=~"$Hostname"}`, "DCGM_FI_DEV_GPU_UTIL"},
		{`sum by (Hostname, gpu) (increase(DCGM_FI_DEV_XID_ERRORS{a="b(c)"}[5m]))`, "DCGM_FI_DEV_XID_ERRORS"},
		{`a * on (hpc_job) group_left (job_name) b`, "a b"},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))`, "x_bucket"},
		{`rate(e[1m]) / 1e3 > 0 and bool c`, "e c"},
	}
	for _, tc := range tests {
		if got := strings.Join(metricNames(tc.expr), " "); got != tc.want {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// exported is every metric name gpuctl serves, with the series names a
// histogram adds.
func exported() map[string]bool {
	out := map[string]bool{}
	for _, n := range append(agent.MetricNames(), metrics.Names()...) {
		out[n] = true
		if strings.HasSuffix(n, "_seconds") {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[n+s] = true
			}
		}
	}
	return out
}

// TestDashboardMetricsExist checks that the dashboard reads only metrics
// nodemon or gpuctl serve registers, so a rename cannot leave a panel
// empty.
func TestDashboardMetricsExist(t *testing.T) {
	have := exported()
	used := map[string]bool{}
	for _, q := range dashboardQueries(t) {
		names := metricNames(q.expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		for _, n := range names {
			used[n] = true
			if !have[n] {
				t.Errorf("%s: %q reads %s, which neither nodemon nor gpuctl serve exports", q.where, q.expr, n)
			}
		}
	}
	// The dashboard shows what operators look at first.
	for _, n := range []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "gpuctl_job_steps_per_second", "gpuctl_job_goodput_ratio",
		"gpuctl_job_checkpoint_age_seconds", "gpuctl_nodes", "gpuctl_scheduler_pass_duration_seconds_bucket"} {
		if !used[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("dashboard reads %d metrics: %s", len(names), strings.Join(names, " "))
}
