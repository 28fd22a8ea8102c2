package views

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

func TestDescribe(t *testing.T) {
	nodes, jobs, events := sampleNodes(), sampleJobs(), sampleEvents()
	history := []*api.GPUSample{
		{TimeUnixNano: now.Add(-time.Minute).UnixNano(), UtilGpuPercent: 90, TempC: 60, PowerMw: 500000},
		{TimeUnixNano: now.UnixNano(), UtilGpuPercent: 100, TempC: 70, PowerMw: 600000},
	}
	pages := map[string]func(w *bytes.Buffer, o Options) error{
		"node":        func(w *bytes.Buffer, o Options) error { return DescribeNode(w, o, nodes[0], jobs, events) },
		"node_down":   func(w *bytes.Buffer, o Options) error { return DescribeNode(w, o, nodes[2], jobs, nil) },
		"job":         func(w *bytes.Buffer, o Options) error { return DescribeJob(w, o, jobs[0], sampleStalls()[:1], events) },
		"job_pending": func(w *bytes.Buffer, o Options) error { return DescribeJob(w, o, jobs[1], nil, nil) },
		"job_typed":   func(w *bytes.Buffer, o Options) error { return DescribeJob(w, o, typedJob(jobs[0]), nil, nil) },
		"gpu": func(w *bytes.Buffer, o Options) error {
			return DescribeGPU(w, o, nodes[0], nodes[0].GetGpus()[0], history, jobs, events)
		},
		"gpu_unhealthy": func(w *bytes.Buffer, o Options) error {
			return DescribeGPU(w, o, nodes[2], nodes[2].GetGpus()[0], nil, jobs, events)
		},
	}
	for name, page := range pages {
		for _, width := range []int{80, 160} {
			t.Run(name+"/"+map[int]string{80: "80", 160: "160"}[width], func(t *testing.T) {
				var b bytes.Buffer
				if err := page(&b, Options{Format: Table, Width: width, Now: now}); err != nil {
					t.Fatal(err)
				}
				golden(t, b.Bytes())
				if strings.ContainsRune(b.String(), 0x1b) {
					t.Error("a raw escape character reached the page")
				}
			})
		}
	}
}

// typedJob is j allowing h100 and a100-80gb, started on the h100s.
func typedJob(j *api.Job) *api.Job {
	j = proto.Clone(j).(*api.Job)
	j.TypePlans = []*api.JobTypePlan{
		{GpuModel: "h100", Plan: &api.JobPlan{Tp: 8, Pp: 1, Dp: 2, Source: "planner", StepSeconds: 0.81}},
		{GpuModel: "a100-80gb", Plan: &api.JobPlan{Tp: 4, Pp: 2, Dp: 2, Source: "planner", StepSeconds: 1.54}},
	}
	j.Plan = proto.Clone(j.TypePlans[0].Plan).(*api.JobPlan)
	j.FullGpus = 16
	j.GpuType, j.GpuTypeReason = "h100", "h100: 1.90× its a100-80gb throughput; max-throughput"
	return j
}
