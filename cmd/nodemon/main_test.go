package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseLabels(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{"none", nil, map[string]string{}, false},
		{"two", []string{"rack=r1", "switch=s1"}, map[string]string{"rack": "r1", "switch": "s1"}, false},
		{"empty value", []string{"zone="}, map[string]string{"zone": ""}, false},
		{"value with =", []string{"k=a=b"}, map[string]string{"k": "a=b"}, false},
		{"no =", []string{"rack"}, nil, true},
		{"no key", []string{"=x"}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLabels(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestRankShimSubcommand runs the hidden subcommand nodemon re-executes
// itself with for every rank: the rank's output lands in the log and its
// real exit status in the status file.
func TestRankShimSubcommand(t *testing.T) {
	dir := t.TempDir()
	logf, status := filepath.Join(dir, "rank-0.log"), filepath.Join(dir, "rank-0.status")
	cmd := newRootCmd()
	cmd.SetArgs([]string{"rank-shim", "--log", logf, "--status", status, "--", "/bin/sh", "-c", "echo step 1 loss=1; exit 7"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(logf)
	if !strings.Contains(string(out), "\nstep 1 loss=1\n") {
		t.Fatalf("log lacks the rank's output:\n%s", out)
	}
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		RankPID  int `json:"rank_pid"`
		ExitCode int `json:"exit_code"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.ExitCode != 7 || st.RankPID <= 0 {
		t.Fatalf("status file %s (err %v), want exit code 7", b, err)
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("gpj1.abc.123.mac.hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, token, file, stdin string
		want, err                string
	}{
		{name: "none", want: ""},
		{name: "argv", token: "gpj1.x", want: "gpj1.x"},
		{name: "file", file: file, want: "gpj1.abc.123.mac.hash"},
		{name: "stdin", token: "-", stdin: "gpj1.from.stdin\n", want: "gpj1.from.stdin"},
		{name: "stdin without newline", token: "-", stdin: "gpj1.eof", want: "gpj1.eof"},
		{name: "stdin first line only", token: "-", stdin: "gpj1.one\nsecond line\n", want: "gpj1.one"},
		{name: "empty stdin", token: "-", stdin: "", err: "stdin is empty"},
		{name: "empty file", file: empty, err: empty + " is empty"},
		{name: "missing file", file: filepath.Join(dir, "nope"), err: "--token-file"},
		{name: "both", token: "x", file: file, err: "pass one"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readToken(tc.token, tc.file, strings.NewReader(tc.stdin))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to say %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("readToken = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestAllowRootRanksFlag: root ranks are refused unless nodemon is started
// with --allow-root-ranks, and the flag reaches the agent's config.
func TestAllowRootRanksFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--server", "h:1"}, false},
		{[]string{"--server", "h:1", "--allow-root-ranks"}, true},
	} {
		var got *bool
		cmd := rootCmd(func(o *options) error { v := o.cfg.AllowRootRanks; got = &v; return nil })
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != tc.want {
			t.Fatalf("nodemon %v: AllowRootRanks = %v, want %v", tc.args, got, tc.want)
		}
	}
}
