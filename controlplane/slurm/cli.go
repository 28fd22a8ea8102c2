package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"
)

// CLI runs Slurm's command-line tools.
type CLI struct {
	// Env is added to the tools' environment (SLURM_CONF, say).
	Env []string
	// Bin, when set, is the directory holding the tools; else PATH.
	Bin string
}

// Run runs one tool with stdin (may be nil) and returns its standard
// output; an error says what failed and what to do about it.
func (c *CLI) Run(ctx context.Context, stdin []byte, extraEnv []string, name string, args ...string) (string, error) {
	path := name
	if c.Bin != "" {
		path = c.Bin + "/" + name
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(append(cmd.Environ(), c.Env...), extraEnv...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err == nil {
		return out.String(), nil
	}
	return out.String(), cliError(name, args, err, strings.TrimSpace(stderr.String()), ctx.Err())
}

// CLIError is a failed Slurm command. Unavailable: Slurm could not be
// asked (a missing tool, a controller that does not answer, failed
// authentication), as opposed to Slurm refusing what was asked.
type CLIError struct {
	Msg         string
	Unavailable bool
}

func (e *CLIError) Error() string { return e.Msg }

// cliError words a failed Slurm command: a missing tool, a controller
// that does not answer, or the tool's own complaint.
func cliError(name string, args []string, err error, stderr string, ctxErr error) error {
	what := name
	if len(args) > 0 {
		what += " " + args[0]
	}
	down := func(format string, a ...any) error {
		return &CLIError{Msg: what + ": " + fmt.Sprintf(format, a...), Unavailable: true}
	}
	switch {
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist):
		return down("Slurm's %s is not installed here (%v): install Slurm's client tools (Debian: slurm-client) on the gpuctl serve host, or run gpuctl serve --executor nodemon", name, err)
	case ctxErr != nil:
		return down("no answer in time (%v): is slurmctld up? check `scontrol ping`", ctxErr)
	case strings.Contains(stderr, "Unable to contact slurm controller") || strings.Contains(stderr, "Socket timed out") ||
		strings.Contains(stderr, "Connection refused") || strings.Contains(stderr, "Zero Bytes were transmitted"):
		return down("slurmctld is not answering (%s): start it or check `scontrol ping`; gpuctl retries and loses nothing", firstLine(stderr))
	case strings.Contains(stderr, "munge") || strings.Contains(stderr, "Munge"):
		return down("Slurm authentication failed (%s): is munged running with the cluster's key?", firstLine(stderr))
	}
	if stderr == "" {
		stderr = err.Error()
	}
	return &CLIError{Msg: what + ": " + firstLine(stderr)}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// shellQuote quotes one word for sh.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
