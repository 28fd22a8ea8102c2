package app

import (
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/views"
)

// TestDurationIsTheCLIs: the console shows a span as `gpuctl` tables do,
// in ages and in lateness past ten seconds.
func TestDurationIsTheCLIs(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	tests := []struct {
		name string
		d    time.Duration
		want string
	}{
		{"negative", -time.Second, "0s"},
		{"under ten seconds", 4200 * time.Millisecond, "4.2s"},
		{"minutes", 3*time.Minute + 12*time.Second, "3m12s"},
		{"hours", 5*time.Hour + 3*time.Minute, "5h3m"},
		{"days", 50 * time.Hour, "2d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := views.Duration(tt.d); got != tt.want {
				t.Errorf("views.Duration(%v) = %q, want %q", tt.d, got, tt.want)
			}
			if got := Duration(tt.d); got != views.Duration(tt.d) {
				t.Errorf("console %q, CLI %q", got, views.Duration(tt.d))
			}
			if got := Age(now, now.Add(-tt.d).UnixNano()); got != views.Duration(tt.d) {
				t.Errorf("console age %q, CLI %q", got, views.Duration(tt.d))
			}
			if tt.d >= 10*time.Second {
				if got := Late(tt.d); got != views.Duration(tt.d) {
					t.Errorf("console lateness %q, CLI %q", got, views.Duration(tt.d))
				}
			}
		})
	}
}
