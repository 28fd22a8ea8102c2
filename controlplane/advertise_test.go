package controlplane

import (
	"context"
	"strings"
	"testing"
)

// TestAdvertiseWarning: a server bound to one address warns when no
// advertised address reaches it, by name or by the address a name
// resolves to; a server bound to every address, or advertising none,
// says nothing.
func TestAdvertiseWarning(t *testing.T) {
	tests := []struct {
		name, listen, advertise string
		warn                    bool
	}{
		{"the bound address advertised", "127.0.0.1:7443", "127.0.0.1:7443", false},
		{"the bound address among others", "127.0.0.2:7443", "127.0.0.1:7443,127.0.0.2:7443", false},
		{"a name resolving to it", "127.0.0.1:7443", "localhost:7443", false},
		{"bound by name, advertised by address", "localhost:7443", "127.0.0.1:7443", false},
		{"IPv6 spelled two ways", "[::1]:7443", "[0:0:0:0:0:0:0:1]:7443", false},
		{"every address bound", ":7443", "10.0.0.9:7443", false},
		{"every IPv4 address bound", "0.0.0.0:7443", "10.0.0.9:7443", false},
		{"nothing advertised", "127.0.0.1:7443", "", false},
		{"an ephemeral port: the host decides", "127.0.0.1:0", "127.0.0.1:7443", false},
		{"another address", "127.0.0.1:7443", "127.0.0.2:7443", true},
		{"only the other servers", "127.0.0.1:7443", "127.0.0.2:7443,127.0.0.3:7443", true},
		{"the right host, another port", "127.0.0.1:7443", "127.0.0.1:7444", true},
		{"a name resolving elsewhere", "127.0.0.2:7443", "localhost:7443", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := AdvertiseWarning(context.Background(), tc.listen, tc.advertise)
			if (w != "") != tc.warn {
				t.Fatalf("AdvertiseWarning(%q, %q) = %q, want a warning: %v", tc.listen, tc.advertise, w, tc.warn)
			}
			if tc.warn && !strings.Contains(w, "--listen "+tc.listen) || tc.warn && !strings.Contains(w, "--advertise "+tc.advertise) {
				t.Fatalf("the warning does not name both flags' values: %q", w)
			}
		})
	}
}
