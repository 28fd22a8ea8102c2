package transport

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Files a joined node keeps in its state dir.
const (
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// Identity is a certificate, its key and the cluster CA it chains to: what
// a node or a client presents when it dials the server.
type Identity struct {
	// Certificate holds the leaf certificate, its key and parsed Leaf.
	Certificate tls.Certificate
	// CA is the cluster CA the server's certificate must chain to.
	CA *x509.Certificate
	// Role and Name are what the certificate carries.
	Role Role
	Name string
}

func newIdentity(cert *x509.Certificate, key crypto.Signer, ca *x509.Certificate) (*Identity, error) {
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, errors.New("certificate does not match private key")
	}
	if !ca.IsCA {
		return nil, errors.New("CA certificate is not a CA")
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("certificate %q is not signed by the CA certificate: %w", cert.Subject.CommonName, err)
	}
	role, name, err := RoleOf(cert)
	if err != nil {
		return nil, err
	}
	return &Identity{
		Certificate: tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert},
		CA:          ca,
		Role:        role,
		Name:        name,
	}, nil
}

// LoadNodeIdentity loads the node certificate, key and CA that Join stored
// in dir.
func LoadNodeIdentity(dir string) (*Identity, error) {
	id, err := loadIdentity(filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile), filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("load node identity from %s: %w (join the cluster again with a new token if the files are lost)", dir, err)
	}
	if id.Role != RoleNode {
		return nil, fmt.Errorf("load node identity from %s: %s carries role %q, not node", dir, NodeCertFile, id.Role)
	}
	return id, nil
}

func loadIdentity(certPath, keyPath, caPath string) (*Identity, error) {
	cert, err := readCertFile(certPath)
	if err != nil {
		return nil, err
	}
	key, err := readKeyFile(keyPath)
	if err != nil {
		return nil, err
	}
	ca, err := readCertFile(caPath)
	if err != nil {
		return nil, err
	}
	id, err := newIdentity(cert, key, ca)
	if err != nil {
		return nil, fmt.Errorf("%s, %s, %s: %w", certPath, keyPath, caPath, err)
	}
	return id, nil
}

// saveIdentity writes id's certificate, key and CA to the given paths,
// refusing to replace an existing key or certificate. An existing CA file is
// reused when it holds the same certificate.
func saveIdentity(id *Identity, certPath, keyPath, caPath string) error {
	for _, p := range []string{certPath, keyPath} {
		have, err := exists(p)
		if err != nil {
			return err
		}
		if have {
			return fmt.Errorf("%s already exists; refusing to overwrite it: move it aside first", p)
		}
	}
	caPEM := certPEM(id.CA.Raw)
	if old, err := os.ReadFile(caPath); err == nil {
		if !bytes.Equal(old, caPEM) {
			return fmt.Errorf("%s already exists and holds another CA; refusing to overwrite it: move it aside first", caPath)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", caPath, err)
	} else if err := writeFileNew(caPath, caPEM, 0o644); err != nil {
		return err
	}
	signer, ok := id.Certificate.PrivateKey.(crypto.Signer)
	if !ok {
		return fmt.Errorf("private key of type %T cannot be stored", id.Certificate.PrivateKey)
	}
	kp, err := keyPEM(signer)
	if err != nil {
		return err
	}
	if err := writeFileNew(keyPath, kp, 0o600); err != nil {
		return err
	}
	return writeFileNew(certPath, certPEM(id.Certificate.Certificate[0]), 0o644)
}

// NewClientIdentity builds a client identity from the certificate the
// server issued (DER), the key the client generated for it and the cluster
// CA (DER), checking that they belong together.
func NewClientIdentity(certDER []byte, key crypto.Signer, caDER []byte) (*Identity, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("parse client certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	id, err := newIdentity(cert, key, ca)
	if err != nil {
		return nil, err
	}
	if !id.Role.IsClient() {
		return nil, fmt.Errorf("certificate %q carries role %q, not a client role", id.Name, id.Role)
	}
	return id, nil
}

// ClientConfig is a gpuctl client's configuration file: the server to dial
// and its identity, as files (relative paths are relative to the config
// file) or inline as PEM text (ca_data, cert_data, key_data), one of the
// two for each. The servers of a highly available control plane are given
// as server: a:7443,b:7443 or as a list under servers:; once loaded, both
// fields hold them all (Server comma-separated), in the order tried.
type ClientConfig struct {
	Server   string   `yaml:"server,omitempty"`
	Servers  []string `yaml:"servers,omitempty"`
	CA       string   `yaml:"ca,omitempty"`
	Cert     string   `yaml:"cert,omitempty"`
	Key      string   `yaml:"key,omitempty"`
	CAData   string   `yaml:"ca_data,omitempty"`
	CertData string   `yaml:"cert_data,omitempty"`
	KeyData  string   `yaml:"key_data,omitempty"`
}

// ClientConfigYAML returns a self-contained client config for dialing
// server with id: the certificates and the key inline. Whoever holds it
// acts as id, so keep it as private as a key file (mode 0600).
func ClientConfigYAML(server string, id *Identity) ([]byte, error) {
	if _, err := ParseServers(server); err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	signer, ok := id.Certificate.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("client config: private key of type %T cannot be stored", id.Certificate.PrivateKey)
	}
	kp, err := keyPEM(signer)
	if err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	cfg := ClientConfig{Server: server, CAData: string(certPEM(id.CA.Raw)), CertData: string(certPEM(id.Certificate.Certificate[0])), KeyData: string(kp)}
	return yaml.Marshal(&cfg)
}

// WriteClientConfig writes a client config at path (YAML) for dialing
// server with id, storing the identity next to it as <base>.crt, <base>.key
// and ca.crt, where <base> is the config file's name without extension. It
// refuses to overwrite an existing config, certificate or key.
func WriteClientConfig(path, server string, id *Identity) error {
	if _, err := ParseServers(server); err != nil {
		return fmt.Errorf("write client config %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	cfg := ClientConfig{Server: server, CA: CACertFile, Cert: base + ".crt", Key: base + ".key"}
	have, err := exists(path)
	if err != nil {
		return err
	}
	if have {
		return fmt.Errorf("write client config: %s already exists; refusing to overwrite it", path)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write client config %s: %w", path, err)
	}
	if err := saveIdentity(id, filepath.Join(dir, cfg.Cert), filepath.Join(dir, cfg.Key), filepath.Join(dir, cfg.CA)); err != nil {
		return fmt.Errorf("write client config %s: %w", path, err)
	}
	data, err := yaml.Marshal(&cfg)
	if err != nil {
		return fmt.Errorf("write client config %s: %w", path, err)
	}
	if err := writeFileNew(path, data, 0o600); err != nil {
		return fmt.Errorf("write client config: %w", err)
	}
	return nil
}

// LoadClientConfig reads a client config file and the identity it names:
// of a file with contexts, the one $GPUCTL_CONTEXT names, else its
// current_context (see Contexts).
// The returned config's paths are resolved against the file's directory.
func LoadClientConfig(path string) (*ClientConfig, *Identity, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load client config: %w", err)
	}
	if data, err = selectContext(path, data, os.Getenv(EnvContext)); err != nil {
		return nil, nil, err
	}
	cfg, err := parseClientConfig(data, filepath.Dir(path))
	if err != nil {
		return nil, nil, fmt.Errorf("client config %s: %w", path, err)
	}
	var id *Identity
	if cfg.KeyData != "" {
		id, err = loadInlineIdentity(path, cfg)
	} else {
		id, err = loadIdentity(cfg.Cert, cfg.Key, cfg.CA)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("client config %s: %w", path, err)
	}
	if !id.Role.IsClient() {
		return nil, nil, fmt.Errorf("client config %s: the certificate carries role %q, not a client role", path, id.Role)
	}
	return cfg, id, nil
}

// loadInlineIdentity reads an identity whose parts sit in the config file
// (or, for the CA and certificate, in files it names).
func loadInlineIdentity(path string, cfg *ClientConfig) (*Identity, error) {
	// The file holds a key: the same rule as for key files.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("holds a private key (key_data) but has mode %#o and is readable by other users: run chmod 600 %s", perm, path)
	}
	key, err := parseKeyPEM([]byte(cfg.KeyData))
	if err != nil {
		return nil, fmt.Errorf("key_data: %w", err)
	}
	cert, err := certFrom("cert", cfg.Cert, cfg.CertData)
	if err != nil {
		return nil, err
	}
	ca, err := certFrom("ca", cfg.CA, cfg.CAData)
	if err != nil {
		return nil, err
	}
	return newIdentity(cert, key, ca)
}

func certFrom(field, path, data string) (*x509.Certificate, error) {
	if data == "" {
		return readCertFile(path)
	}
	cert, err := parseCertPEM([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("%s_data: %w", field, err)
	}
	return cert, nil
}

// parseClientConfig decodes a client config strictly and resolves relative
// paths against dir.
func parseClientConfig(data []byte, dir string) (*ClientConfig, error) {
	var cfg ClientConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse YAML (want keys server or servers, ca, cert, key, or ca_data, cert_data, key_data): %w", err)
	}
	if cfg.Server != "" && len(cfg.Servers) > 0 {
		return nil, errors.New("server and servers both given: keep one (server: a:7443,b:7443 or a list under servers:)")
	}
	servers, err := ParseServers(append([]string{cfg.Server}, cfg.Servers...)...)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	cfg.Servers, cfg.Server = servers, strings.Join(servers, ",")
	for _, f := range []struct {
		key        string
		path, data *string
	}{{"ca", &cfg.CA, &cfg.CAData}, {"cert", &cfg.Cert, &cfg.CertData}, {"key", &cfg.Key, &cfg.KeyData}} {
		hasPath, hasData := strings.TrimSpace(*f.path) != "", strings.TrimSpace(*f.data) != ""
		switch {
		case hasPath && hasData:
			return nil, fmt.Errorf("%s and %s_data both given: keep one", f.key, f.key)
		case !hasPath && !hasData:
			return nil, fmt.Errorf("%s: missing; give the path of the %s file (or the PEM text as %s_data)", f.key, f.key, f.key)
		case hasData:
			*f.path = ""
			continue
		}
		*f.data = ""
		if !filepath.IsAbs(*f.path) {
			*f.path = filepath.Join(dir, *f.path)
		}
	}
	return &cfg, nil
}

// ClusterID names the cluster a CA certificate is the root of: the first
// 16 hex digits of its SHA-256. Ranks carry it (GPUCTL_CLUSTER) so that
// two clusters sharing a host tell their ranks apart.
func ClusterID(ca *x509.Certificate) string {
	if ca == nil {
		return ""
	}
	sum := sha256.Sum256(ca.Raw)
	return hex.EncodeToString(sum[:8])
}
