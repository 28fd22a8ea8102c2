package slurm

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: nil},
		{in: "(null)", want: nil},
		{in: "node1", want: []string{"node1"}},
		{in: "node[1-3,5]", want: []string{"node1", "node2", "node3", "node5"}},
		{in: "node[1-2],gpu7", want: []string{"node1", "node2", "gpu7"}},
		{in: "gpu[08-11]", want: []string{"gpu08", "gpu09", "gpu10", "gpu11"}},
		{in: "rack[1-2]-n[1-2]", want: []string{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
		{in: "a[1],b[2-3]-ib", want: []string{"a1", "b2-ib", "b3-ib"}},
		{in: "node[3-1]", err: "N ≤ M"},
		{in: "node[1-", err: "without ']'"},
		{in: "node1]", err: "without '['"},
		{in: "node[a-b]", err: "not N or N-M"},
		{in: "node[1-99999999]", err: "more than"},
		{in: "node1,,node2", err: "empty name"},
	} {
		got, err := ExpandHostlist(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ExpandHostlist(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandHostlist(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSbatch(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "42\n", want: "42"},
		{in: "42;cluster\n", want: "42"},
		{in: "sbatch: warning: something\n43\n", want: "43"},
		{in: "", err: "not a job id"},
		{in: "Submitted batch job 7", err: "not a job id"},
	} {
		got, err := ParseSbatch(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSbatch(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSbatch(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSqueue(t *testing.T) {
	out := "12|RUNNING|2|node[1-2]|None|gpuctl:j-1:3|gpuctl-train|x\n13|PENDING|1||Resources|(null)|mine\n"
	got, err := ParseSqueue(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d jobs, want 2: %+v", len(got), got)
	}
	if j := got[0]; j.ID != "12" || j.State != "RUNNING" || j.NumNodes != 2 || !slices.Equal(j.Nodes, []string{"node1", "node2"}) ||
		j.Comment != "gpuctl:j-1:3" || j.Name != "gpuctl-train|x" {
		t.Errorf("first job = %+v", j)
	}
	if j := got[1]; j.ID != "13" || j.State != "PENDING" || j.Nodes != nil || j.Reason != "Resources" || j.Comment != "" || j.Name != "mine" {
		t.Errorf("second job = %+v", j)
	}
	for _, bad := range []string{"12|RUNNING|2|node[1-2]", "12|RUNNING|two|n1|r|c|n", "12|RUNNING|1|n[1-|r|c|n", "|RUNNING|1|n1|r|c|n"} {
		if _, err := ParseSqueue(bad); err == nil {
			t.Errorf("ParseSqueue(%q) = nil error", bad)
		}
	}
}

func TestParseSinfo(t *testing.T) {
	out := `node1|idle|none
node2|down*|Not responding
node3|drained|gpuctl: cordoned by alice: fan|x
node4|draining|maint
node5|mixed|none
node6|idle+drain|hw
node7|down+drain|test
node1|idle|none
`
	got, err := ParseSinfo(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeState{
		{Name: "node1", State: "idle"},
		{Name: "node2", State: "down", NotResponding: true, Reason: "Not responding"},
		{Name: "node3", State: "drained", Reason: "gpuctl: cordoned by alice: fan|x"},
		{Name: "node4", State: "draining", Reason: "maint"},
		{Name: "node5", State: "mixed"},
		{Name: "node6", State: "drained", Reason: "hw"},
		{Name: "node7", State: "down", Reason: "test"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("ParseSinfo = %+v\nwant %+v", got, want)
	}
	unavail := map[string]bool{"node2": true, "node3": true, "node4": true, "node6": true, "node7": true}
	for _, n := range got {
		if n.Unavailable() != unavail[n.Name] {
			t.Errorf("%s Unavailable() = %v", n.Name, n.Unavailable())
		}
	}
	if _, err := ParseSinfo("node1 idle\n"); err == nil {
		t.Error("ParseSinfo of a line without fields: nil error")
	}
}

const scontrolOut = `JobId=1 JobName=job.sh
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   ReqNodeList=node[1-2] ExcNodeList=(null)
   NodeList=node[1-2]
   NumNodes=2 NumCPUs=4 NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   Socks/Node=* NtasksPerN:B:S:C=2:0:*:* CoreSpec=*
   JOB_GRES=gpu:4
     Nodes=node[1-2] CPU_IDs=6-7 Mem=0 GRES=gpu:2(IDX:0-1)
   Command=/tmp/my job.sh
   Comment=gpuctl:j-1:2 

JobId=2 JobName=other
   JobState=PENDING Reason=Resources Dependency=(null)
   NodeList=(null)
`

func TestParseScontrolJobs(t *testing.T) {
	jobs, err := ParseScontrolJobs(scontrolOut)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("got %d jobs, want 2", len(jobs))
	}
	j := jobs[0]
	for k, want := range map[string]string{"JobId": "1", "JobState": "RUNNING", "NodeList": "node[1-2]", "NumTasks": "4",
		"NtasksPerN:B:S:C": "2:0:*:*", "Command": "/tmp/my job.sh", "Comment": "gpuctl:j-1:2", "ExcNodeList": "", "Restarts": "0"} {
		if got := j.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if len(j.Details) != 1 || j.Details[0]["Nodes"] != "node[1-2]" || j.Details[0]["GRES"] != "gpu:2(IDX:0-1)" {
		t.Errorf("details = %v", j.Details)
	}
	if jobs[1].Get("JobState") != "PENDING" || jobs[1].Get("NodeList") != "" {
		t.Errorf("second job = %v", jobs[1].Fields)
	}
	for _, bad := range []string{"   JobState=RUNNING\n", "JobId=1\n   no key here\n"} {
		if _, err := ParseScontrolJobs(bad); err == nil {
			t.Errorf("ParseScontrolJobs(%q) = nil error", bad)
		}
	}
}

func TestParseSacct(t *testing.T) {
	got, err := ParseSacct("7|COMPLETED|0:0|node[1-2]\n7.batch|COMPLETED|0:0|node1\n")
	if err != nil || len(got) != 2 || got[0].State != "COMPLETED" || !slices.Equal(got[0].Nodes, []string{"node1", "node2"}) {
		t.Errorf("ParseSacct = %+v, %v", got, err)
	}
	if _, err := ParseSacct("7|COMPLETED\n"); err == nil {
		t.Error("ParseSacct of a short line: nil error")
	}
}

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{"node[1-3,5]", "rack[1-2]-n[01-02]", "a,b", "x[", "]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ExpandHostlist(s)
		if err == nil && len(hosts) > maxHosts {
			t.Fatalf("%q expanded to %d hosts, past the bound", s, len(hosts))
		}
	})
}

func FuzzParseSqueue(f *testing.F) {
	f.Add("12|RUNNING|2|node[1-2]|None|gpuctl:j-1:3|gpuctl-train\n")
	f.Fuzz(func(t *testing.T, s string) {
		jobs, err := ParseSqueue(s)
		for _, j := range jobs {
			if err == nil && j.ID == "" {
				t.Fatalf("job without an id from %q", s)
			}
		}
	})
}

func FuzzParseSinfo(f *testing.F) {
	f.Add("node1|idle|none\nnode2|down*|x\n")
	f.Fuzz(func(t *testing.T, s string) {
		nodes, err := ParseSinfo(s)
		for _, n := range nodes {
			if err == nil && (n.Name == "" || n.State == "" && !strings.Contains(s, n.Name+"|")) {
				t.Fatalf("node %+v from %q", n, s)
			}
		}
	})
}

func FuzzParseScontrolJobs(f *testing.F) {
	f.Add(scontrolOut)
	f.Fuzz(func(t *testing.T, s string) {
		jobs, err := ParseScontrolJobs(s)
		if err == nil {
			for _, j := range jobs {
				if _, ok := j.Fields["JobId"]; !ok {
					t.Fatalf("job without JobId from %q", s)
				}
			}
		}
	})
}

func FuzzParseSbatch(f *testing.F) {
	f.Add("42;c\n")
	f.Fuzz(func(t *testing.T, s string) {
		if id, err := ParseSbatch(s); err == nil && id == "" {
			t.Fatalf("empty id from %q", s)
		}
	})
}

func FuzzParseSacct(f *testing.F) {
	f.Add("7|COMPLETED|0:0|node[1-2]\n")
	f.Fuzz(func(t *testing.T, s string) { ParseSacct(s) })
}
