package etcdstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpuctl/gpuctl/store/etcdembed"
)

// writePKI writes a CA and one certificate for 127.0.0.1, good for both
// serving and client auth, as PEM files in dir.
func writePKI(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "member"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kDER, _ := x509.MarshalECPrivateKey(k)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, b := range map[string]*pem.Block{ca: {Type: "CERTIFICATE", Bytes: caDER}, cert: {Type: "CERTIFICATE", Bytes: der}, key: {Type: "EC PRIVATE KEY", Bytes: kDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

func TestClientConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writePKI(t, dir)
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate"), 0o600)
	eps := []string{"https://127.0.0.1:2379"}
	tests := []struct {
		name             string
		eps              []string
		ca, cert, key    string
		wantErr, wantTLS bool
		errSays          string
	}{
		{"plain", eps, "", "", "", false, false, ""},
		{"TLS", eps, ca, cert, key, false, true, ""},
		{"server auth only", eps, ca, "", "", false, true, ""},
		{"no endpoints", nil, "", "", "", true, false, "no endpoints"},
		{"missing CA", eps, filepath.Join(dir, "nope.pem"), cert, key, true, false, "nope.pem"},
		{"CA not PEM", eps, junk, cert, key, true, false, "no PEM certificate"},
		{"cert without key", eps, ca, cert, "", true, false, "both its cert file and key file"},
		{"bad key", eps, ca, cert, junk, true, false, "junk.pem"},
		{"key of another cert", eps, ca, ca, key, true, false, "ca.pem"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ClientConfig(tc.eps, tc.ca, tc.cert, tc.key)
			if (err != nil) != tc.wantErr || err != nil && !strings.Contains(err.Error(), tc.errSays) {
				t.Fatalf("err = %v, want error %v saying %q", err, tc.wantErr, tc.errSays)
			}
			if err == nil && (cfg.TLS != nil) != tc.wantTLS {
				t.Fatalf("TLS = %v, want %v", cfg.TLS != nil, tc.wantTLS)
			}
		})
	}
}

// TestEmbeddedMemberWithTLS runs the production entry point with mutual
// TLS and opens the store through ClientConfig; a client without a
// certificate is refused.
func TestEmbeddedMemberWithTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writePKI(t, dir)
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := etcdembed.Start(context.Background(), etcdembed.Config{
		Name: "gpuctl-0", DataDir: filepath.Join(dir, "etcd"),
		ClientURLs: fmt.Sprintf("https://127.0.0.1:%d", ports[0]), PeerURLs: fmt.Sprintf("https://127.0.0.1:%d", ports[1]),
		TLS: &etcdembed.TLS{CAFile: ca, CertFile: cert, KeyFile: key}, LogFile: filepath.Join(dir, "etcd.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	cfg, err := ClientConfig(m.Endpoints(), ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	s := openFenced(t, cli, Options{})
	if v, err := s.LoadOrCreateSecret("ca", func() ([]byte, error) { return []byte("pem"), nil }); err != nil || string(v) != "pem" {
		t.Fatalf("secret over TLS: %q, %v", v, err)
	}

	anon, err := ClientConfig(m.Endpoints(), ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	anon.Logger, anon.DialTimeout = zap.NewNop(), time.Second
	if c2, err := clientv3.New(anon); err == nil {
		defer c2.Close()
		if _, err := Open(context.Background(), c2, Options{Timeout: time.Second}); err == nil {
			t.Fatal("a client without a certificate reached an etcd that requires one")
		}
	}
}

func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
