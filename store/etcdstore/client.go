package etcdstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ClientConfig returns the client configuration for endpoints: plain
// when no file is named, else TLS trusting caFile, with the client
// certificate certFile/keyFile when given (etcd's --client-cert-auth).
func ClientConfig(endpoints []string, caFile, certFile, keyFile string) (clientv3.Config, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		// A member that stops answering is noticed within seconds, so
		// requests move to the others.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		// gRPC's own reconnect backoff grows to 2 minutes: after an etcd
		// outage of a minute or two the servers would stay read-only up to
		// that long after etcd is back. A few members are cheap to redial.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	if len(endpoints) == 0 {
		return cfg, fmt.Errorf("etcd: no endpoints (give --etcd-endpoints host:2379,...)")
	}
	if caFile == "" && certFile == "" && keyFile == "" {
		return cfg, nil
	}
	if (certFile == "") != (keyFile == "") {
		return cfg, fmt.Errorf("etcd TLS: a client certificate needs both its cert file and key file (got cert %q, key %q)", certFile, keyFile)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return cfg, fmt.Errorf("etcd TLS: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, fmt.Errorf("etcd TLS: CA file %s holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return cfg, fmt.Errorf("etcd TLS: client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	cfg.TLS = tc
	return cfg, nil
}
