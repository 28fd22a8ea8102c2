package main

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// sinceFlag is a --since value: how long ago (a Go duration, with days
// allowed as in 1d or 2d12h) or a time (RFC 3339).
type sinceFlag struct {
	text string
	ago  time.Duration
	t    time.Time // set for an RFC 3339 value
	set  bool
}

var daysPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// parseSince reads a --since value.
func parseSince(s string) (sinceFlag, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return sinceFlag{text: s, t: t, set: true}, nil
	}
	var days time.Duration
	rest := s
	if m := daysPrefix.FindStringSubmatch(s); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n > 100000 {
			return sinceFlag{}, fmt.Errorf("%q: too many days", s)
		}
		days, rest = time.Duration(n)*24*time.Hour, m[2]
	}
	var d time.Duration
	if rest != "" {
		var err error
		if d, err = time.ParseDuration(rest); err != nil {
			return sinceFlag{}, fmt.Errorf("%q: want a duration (30s, 10m, 1d, 2d12h) or an RFC 3339 time (2026-03-01T12:00:00Z)", s)
		}
	}
	if d+days <= 0 {
		return sinceFlag{}, fmt.Errorf("%q: the duration must be positive", s)
	}
	return sinceFlag{text: s, ago: days + d, set: true}, nil
}

// at is the time the value names, seen from now.
func (f *sinceFlag) at(now time.Time) time.Time {
	if !f.t.IsZero() {
		return f.t
	}
	return now.Add(-f.ago)
}

func (f *sinceFlag) String() string { return f.text }

// Set implements pflag.Value.
func (f *sinceFlag) Set(s string) error {
	v, err := parseSince(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Type implements pflag.Value.
func (f *sinceFlag) Type() string { return "duration|time" }
