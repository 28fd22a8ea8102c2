package trace

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CSVColumns is the header of the CSV trace format. The first four columns
// are required, the rest optional (a file may stop after any of them):
//
//	id               unique job id
//	submit_seconds   submit time in seconds (integer, ≥ 0)
//	gpus             GPUs requested (integer, ≥ 1)
//	runtime_seconds  total execution in seconds, failed attempts included
//	tenant           team, for fair share (may be empty)
//	priority         integer priority, higher first (may be empty: 0)
//	failures         execution offsets in seconds at which attempts failed,
//	                 separated by ';', increasing, each below runtime
var CSVColumns = []string{"id", "submit_seconds", "gpus", "runtime_seconds", "tenant", "priority", "failures"}

// ReadCSV reads the CSV trace format (see CSVColumns). Errors name the line.
func ReadCSV(r io.Reader) ([]Job, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("csv trace is empty; the first line must be the header %s", strings.Join(CSVColumns, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("csv trace header: %w", err)
	}
	if len(header) < 4 || len(header) > len(CSVColumns) {
		return nil, fmt.Errorf("csv trace line 1: header has %d columns; want the first 4 to 7 of %s", len(header), strings.Join(CSVColumns, ","))
	}
	for i, h := range header {
		if strings.TrimSpace(h) != CSVColumns[i] {
			return nil, fmt.Errorf("csv trace line 1: column %d is %q, want %q (header: %s)", i+1, h, CSVColumns[i], strings.Join(CSVColumns, ","))
		}
	}
	var jobs []Job
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("csv trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(header) {
			return nil, fmt.Errorf("csv trace line %d: %d fields, the header has %d", line, len(rec), len(header))
		}
		j, err := csvJob(rec)
		if err != nil {
			return nil, fmt.Errorf("csv trace line %d: %w", line, err)
		}
		jobs = append(jobs, j)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("csv trace has a header but no jobs")
	}
	if err := sortJobs(jobs); err != nil {
		return nil, fmt.Errorf("csv trace: %w", err)
	}
	return jobs, nil
}

func csvJob(rec []string) (Job, error) {
	j := Job{ID: strings.TrimSpace(rec[0])}
	num := func(col int) (int64, error) {
		v, err := strconv.ParseInt(strings.TrimSpace(rec[col]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not an integer", CSVColumns[col], rec[col])
		}
		return v, nil
	}
	var err error
	if j.Submit, err = num(1); err != nil {
		return j, err
	}
	g, err := num(2)
	if err != nil {
		return j, err
	}
	if g > 1<<20 {
		return j, fmt.Errorf("gpus %d is implausibly large", g)
	}
	j.GPUs = int(g)
	if j.Runtime, err = num(3); err != nil {
		return j, err
	}
	if len(rec) > 4 {
		j.Tenant = strings.TrimSpace(rec[4])
	}
	if len(rec) > 5 && strings.TrimSpace(rec[5]) != "" {
		p, err := strconv.Atoi(strings.TrimSpace(rec[5]))
		if err != nil {
			return j, fmt.Errorf("priority %q is not an integer", rec[5])
		}
		j.Priority = p
	}
	if len(rec) > 6 && strings.TrimSpace(rec[6]) != "" {
		for _, f := range strings.Split(rec[6], ";") {
			v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return j, fmt.Errorf("failure offset %q is not an integer", f)
			}
			j.Failures = append(j.Failures, v)
		}
	}
	return j, j.validate()
}

// WriteCSV writes jobs in the CSV trace format with all columns.
func WriteCSV(w io.Writer, jobs []Job) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVColumns); err != nil {
		return fmt.Errorf("write csv trace: %w", err)
	}
	for _, j := range jobs {
		fs := make([]string, len(j.Failures))
		for i, f := range j.Failures {
			fs[i] = strconv.FormatInt(f, 10)
		}
		rec := []string{j.ID, strconv.FormatInt(j.Submit, 10), strconv.Itoa(j.GPUs), strconv.FormatInt(j.Runtime, 10),
			j.Tenant, strconv.Itoa(j.Priority), strings.Join(fs, ";")}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("write csv trace: job %s: %w", j.ID, err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv trace: %w", err)
	}
	return nil
}
