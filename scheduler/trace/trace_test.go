package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const phillySample = `[
 {"id": "b", "num_gpus": 8, "runtime": 10,
  "attempts": [{"start_time": "2017-10-07 01:12:00", "end_time": "2017-10-07 01:13:00"},
               {"start_time": "2017-10-07 01:20:00", "end_time": "2017-10-07 02:20:00"}],
  "submitted_time": "2017-10-07 01:11:00"},
 {"id": "a", "num_gpus": 4, "runtime": 2, "attempts": [], "submitted_time": "2017-10-07 01:01:00"}
]`

func TestReadPhilly(t *testing.T) {
	jobs, err := ReadPhilly(strings.NewReader(phillySample))
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{
		{ID: "a", Submit: 0, GPUs: 4, Runtime: 120, Clock: time.Date(2017, 10, 7, 1, 1, 0, 0, time.UTC)},
		{ID: "b", Submit: 600, GPUs: 8, Runtime: 60 + 3600, Failures: []int64{60}, Clock: time.Date(2017, 10, 7, 1, 11, 0, 0, time.UTC)},
	}
	if !reflect.DeepEqual(jobs, want) {
		t.Fatalf("jobs = %+v, want %+v", jobs, want)
	}
}

func TestReadPhillyErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not a list", `{}`, "want a JSON list"},
		{"empty", `[]`, "no jobs"},
		{"bad record", `[{"id": 5}]`, "record 0"},
		{"no gpus", `[{"id": "x", "submitted_time": "2017-10-07 01:11:00", "runtime": 1}]`, "missing num_gpus"},
		{"bad time", `[{"id": "x", "num_gpus": 1, "submitted_time": "yesterday", "runtime": 1}]`, `submitted_time "yesterday"`},
		{"backwards attempt", `[{"id": "x", "num_gpus": 1, "submitted_time": "2017-10-07 01:11:00",
			"attempts": [{"start_time": "2017-10-07 02:00:00", "end_time": "2017-10-07 01:00:00"}]}]`, "ends"},
		{"zero gpus second record", `[{"id": "a", "num_gpus": 1, "submitted_time": "2017-10-07 01:11:00", "runtime": 1},
			{"id": "x", "num_gpus": 0, "submitted_time": "2017-10-07 01:11:00", "runtime": 1}]`, "record 1: job x asks for 0 GPUs"},
		{"duplicate", `[{"id": "a", "num_gpus": 1, "submitted_time": "2017-10-07 01:11:00", "runtime": 1},
			{"id": "a", "num_gpus": 1, "submitted_time": "2017-10-07 01:11:00", "runtime": 1}]`, "appears twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPhilly(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// phillyPath is the Philly trace committed beside the tests (see
// testdata/README.md for its source and licence).
var phillyPath = filepath.Join("testdata", "philly-multigpu-3034.json")

func TestLoadRealPhilly(t *testing.T) {
	p := phillyPath
	jobs, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, j := range jobs {
		if len(j.Failures) > 0 {
			failed++
		}
	}
	// The README of the trace: 3,034 jobs, 816 with more than one attempt.
	if len(jobs) != 3034 || failed != 816 {
		t.Fatalf("%d jobs, %d with failures; want 3034 and 816", len(jobs), failed)
	}
}

func TestReadCSV(t *testing.T) {
	in := "id,submit_seconds,gpus,runtime_seconds,tenant,priority,failures\n" +
		"j2,100,8,3600,vision,2,600;1800\n" +
		"j1,0,4,60,,,\n"
	jobs, err := ReadCSV(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{
		{ID: "j1", Submit: 0, GPUs: 4, Runtime: 60},
		{ID: "j2", Submit: 100, GPUs: 8, Runtime: 3600, Tenant: "vision", Priority: 2, Failures: []int64{600, 1800}},
	}
	if !reflect.DeepEqual(jobs, want) {
		t.Fatalf("jobs = %+v", jobs)
	}
	short, err := ReadCSV(strings.NewReader("id,submit_seconds,gpus,runtime_seconds\na,1,2,3\n"))
	if err != nil || len(short) != 1 || short[0].Runtime != 3 {
		t.Fatalf("four columns: %v %v", short, err)
	}
}

func TestReadCSVErrors(t *testing.T) {
	const h = "id,submit_seconds,gpus,runtime_seconds,tenant,priority,failures\n"
	tests := []struct{ name, in, want string }{
		{"empty", "", "header"},
		{"wrong header", "job,submit,gpus,runtime\n", `column 1 is "job"`},
		{"header only", h, "no jobs"},
		{"field count", h + "a,1,2,3\n", "line 2: 4 fields"},
		{"bad gpus", h + "a,1,2,3,,,\nb,1,many,3,,,\n", `line 3: gpus "many"`},
		{"zero runtime", h + "a,1,2,0,,,\n", "runtime 0"},
		{"failure past runtime", h + "a,1,2,10,,,5;10\n", "failure offsets"},
		{"bad priority", h + "a,1,2,10,t,high,\n", `priority "high"`},
		{"duplicate", h + "a,1,2,10,,,\na,2,2,10,,,\n", "appears twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadUnknownExtension(t *testing.T) {
	p := filepath.Join(t.TempDir(), "trace.txt")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "unknown extension") {
		t.Fatalf("err = %v", err)
	}
}

func checkJobs(t *testing.T, jobs []Job) {
	t.Helper()
	for i, j := range jobs {
		if err := j.validate(); err != nil {
			t.Fatalf("parser returned an invalid job: %v", err)
		}
		if i > 0 && jobs[i-1].Submit > j.Submit {
			t.Fatal("jobs not sorted by submit time")
		}
	}
}

func FuzzReadPhilly(f *testing.F) {
	f.Add([]byte(phillySample))
	f.Add([]byte(`[{"id":"x","num_gpus":1,"runtime":1,"submitted_time":"2017-10-07 01:11:00"}]`))
	f.Add([]byte(`[{"id":"x","num_gpus":2,"submitted_time":"2017-10-07 01:11:00","attempts":[{"start_time":"2017-10-07 01:11:00","end_time":"2017-10-07 01:11:00"},{"start_time":"2017-10-07 01:11:00","end_time":"2017-10-07 01:12:00"}]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		jobs, err := ReadPhilly(bytes.NewReader(data))
		if err != nil {
			return
		}
		checkJobs(t, jobs)
	})
}

func FuzzReadCSV(f *testing.F) {
	f.Add([]byte("id,submit_seconds,gpus,runtime_seconds,tenant,priority,failures\nj2,100,8,3600,vision,2,600;1800\n"))
	f.Add([]byte("id,submit_seconds,gpus,runtime_seconds\na,1,2,3\n"))
	f.Add([]byte("id,submit_seconds,gpus,runtime_seconds,tenant\n\"a,b\",1,2,3,\"x\"\"y\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		jobs, err := ReadCSV(bytes.NewReader(data))
		if err != nil {
			return
		}
		checkJobs(t, jobs)
		// What was read writes back and reads the same.
		var buf bytes.Buffer
		if err := WriteCSV(&buf, jobs); err != nil {
			t.Fatal(err)
		}
		again, err := ReadCSV(&buf)
		if err != nil {
			t.Fatalf("re-read: %v\n%s", err, buf.String())
		}
		if !reflect.DeepEqual(jobs, again) {
			t.Fatalf("round trip changed jobs:\n%+v\n%+v", jobs, again)
		}
	})
}
