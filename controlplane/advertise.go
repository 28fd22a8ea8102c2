package controlplane

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/gpuctl/gpuctl/transport"
)

// AdvertiseWarning says what is wrong when listen binds one host and the
// addresses in advertise (comma-separated, as --advertise takes them)
// name neither it nor a name that resolves to it: nodes and clients given
// admin.yaml, and with etcd those the other servers send here, dial the
// advertised addresses, so a typo there strands them. "" when nothing is
// wrong, listen binds every address, or no address is advertised.
//
// It is a warning, not a refusal: behind NAT, a port forward or a name
// only the clients resolve, the address they dial rightly differs from
// the one bound, and the server cannot tell those from a mistake.
func AdvertiseWarning(ctx context.Context, listen, advertise string) string {
	if advertise == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		return ""
	}
	addrs, err := transport.ParseServers(advertise)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	bound := resolve(ctx, host)
	for _, a := range addrs {
		h, p, err := net.SplitHostPort(a)
		if err != nil || (p != port && port != "0") {
			continue
		}
		if h == host || slices.ContainsFunc(resolve(ctx, h), func(ip string) bool { return slices.Contains(bound, ip) }) {
			return ""
		}
	}
	return fmt.Sprintf("--listen %s binds one address, but --advertise %s does not name it: nodes and clients dial the advertised addresses (admin.yaml lists them; with --store etcd the other servers send them to the first), so list this server's own address in --advertise, first with --store etcd, unless NAT, a port forward or a name only clients resolve makes one of them reach it", listen, advertise)
}

// resolve returns the IP addresses host names, itself when it is one; none
// when it cannot be resolved.
func resolve(ctx context.Context, host string) []string {
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return nil
	}
	for i, s := range ips {
		if ip := net.ParseIP(s); ip != nil {
			ips[i] = ip.String()
		}
	}
	return ips
}
