// Package logging builds the slog logger of gpuctl's commands from their
// --log-level and --log-file flags.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// New returns a text logger at level writing to file, or to stderr when
// file is empty. The returned closer closes the file.
func New(level, file string) (*slog.Logger, io.Closer, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	var w io.WriteCloser = nopCloser{os.Stderr}
	if file != "" {
		f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("--log-file: %w", err)
		}
		w = f
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), w, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
