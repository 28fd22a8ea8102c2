package transport

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// Files an Authority keeps in its data dir.
const (
	CACertFile      = "ca.crt"
	CAKeyFile       = "ca.key"
	ServerCertFile  = "server.crt"
	ServerKeyFile   = "server.key"
	TokenSecretFile = "join.secret"
)

const (
	caValidity           = 10 * 365 * 24 * time.Hour
	serverValidity       = 365 * 24 * time.Hour
	defaultNodeCertTTL   = 365 * 24 * time.Hour
	defaultClientCertTTL = 365 * 24 * time.Hour
	// renewBefore is how close to expiry the server certificate is reissued
	// on start, so a server restarted now and then never serves an expired one.
	renewBefore = 30 * 24 * time.Hour
	// clockSkew backdates NotBefore so a peer whose clock is a little behind
	// still accepts a fresh certificate.
	clockSkew       = time.Hour
	tokenSecretSize = 32
)

// Role is what a certificate allows its holder to do. It is stored in the
// certificate Subject's OrganizationalUnit.
type Role string

// Roles a certificate can carry. Viewer, operator and admin are client roles,
// ordered by what they may do.
const (
	RoleServer   Role = "server"
	RoleNode     Role = "node"
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// ParseRole returns the client role named s (viewer, operator or admin).
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	if !r.IsClient() {
		return "", fmt.Errorf("unknown client role %q: use viewer, operator or admin", s)
	}
	return r, nil
}

// IsClient reports whether r is a client role (viewer, operator, admin).
func (r Role) IsClient() bool { return r.rank() > 0 }

// AtLeast reports whether client role r may do what min may do; it is false
// whenever either role is not a client role.
func (r Role) AtLeast(min Role) bool {
	return r.IsClient() && min.IsClient() && r.rank() >= min.rank()
}

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

func (r Role) known() bool { return r == RoleServer || r == RoleNode || r.IsClient() }

// RoleOf returns the role and name a certificate carries. It does not check
// who signed the certificate; the listener does that before using it.
func RoleOf(cert *x509.Certificate) (Role, string, error) {
	if cert == nil {
		return "", "", errors.New("no certificate")
	}
	ou := cert.Subject.OrganizationalUnit
	if len(ou) != 1 || !Role(ou[0]).known() {
		return "", "", fmt.Errorf("certificate %q carries no gpuctl role (organizational unit %q): it was not issued by a gpuctl cluster CA", cert.Subject.CommonName, ou)
	}
	role := Role(ou[0])
	name := cert.Subject.CommonName
	if role != RoleServer {
		if err := ValidateName(name); err != nil {
			return "", "", fmt.Errorf("certificate common name: %w", err)
		}
	}
	return role, name, nil
}

// ValidateName checks a node or client name: 1 to 64 letters, digits, '.',
// '-', '_' or '@', starting with a letter or digit.
func ValidateName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("name %s must be 1 to 64 characters", api.Quote(name))
	}
	for i, c := range name {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("name %s must start with a letter or digit", api.Quote(name))
		}
		if !alnum && c != '.' && c != '-' && c != '_' && c != '@' {
			return fmt.Errorf("name %s has %q: use letters, digits, '.', '-', '_' or '@'", api.Quote(name), c)
		}
	}
	return nil
}

// AuthorityOptions tunes OpenAuthority. The zero value is usable.
type AuthorityOptions struct {
	// ServerNames are extra DNS names or IP addresses, besides localhost,
	// 127.0.0.1, ::1 and the host name, that the server certificate covers.
	ServerNames []string
	// NodeCertTTL and ClientCertTTL are how long issued certificates last
	// (default one year).
	NodeCertTTL   time.Duration
	ClientCertTTL time.Duration
	// Logger receives what the authority creates or renews on disk.
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Authority is the cluster certificate authority kept in a data dir: it
// issues node, client and server certificates and signs join tokens.
type Authority struct {
	dir       string
	log       *slog.Logger
	now       func() time.Time
	nodeTTL   time.Duration
	clientTTL time.Duration

	caCert *x509.Certificate
	caKey  crypto.Signer
	caPool *x509.CertPool
	caHash [sha256.Size]byte
	server tls.Certificate

	mu     sync.RWMutex
	secret []byte
	ledger TokenLedger
}

// OpenAuthority loads the cluster CA from dir, creating the CA, the server
// certificate and the join-token secret on first use. It never replaces an
// existing key: a missing, corrupt or mismatched file is an error naming the
// file and what to do.
func OpenAuthority(dir string, opts AuthorityOptions) (*Authority, error) {
	a := &Authority{
		dir:       dir,
		log:       opts.Logger,
		now:       opts.Now,
		nodeTTL:   opts.NodeCertTTL,
		clientTTL: opts.ClientCertTTL,
		ledger:    &memLedger{},
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.nodeTTL <= 0 {
		a.nodeTTL = defaultNodeCertTTL
	}
	if a.clientTTL <= 0 {
		a.clientTTL = defaultClientCertTTL
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open authority: create data dir: %w", err)
	}
	if err := a.loadOrCreateCA(); err != nil {
		return nil, fmt.Errorf("open authority in %s: %w", dir, err)
	}
	if err := a.loadOrCreateSecret(); err != nil {
		return nil, fmt.Errorf("open authority in %s: %w", dir, err)
	}
	dns, ips, err := serverNames(opts.ServerNames)
	if err != nil {
		return nil, fmt.Errorf("open authority: %w", err)
	}
	if err := a.loadOrCreateServer(dns, ips); err != nil {
		return nil, fmt.Errorf("open authority in %s: %w", dir, err)
	}
	return a, nil
}

func (a *Authority) path(name string) string { return filepath.Join(a.dir, name) }

func (a *Authority) loadOrCreateCA() error {
	certPath, keyPath := a.path(CACertFile), a.path(CAKeyFile)
	haveCert, err := exists(certPath)
	if err != nil {
		return err
	}
	haveKey, err := exists(keyPath)
	if err != nil {
		return err
	}
	switch {
	case !haveCert && !haveKey:
		return a.createCA()
	case haveCert && !haveKey:
		return fmt.Errorf("%s exists but %s is missing: restore %s from a backup, or move %s aside to create a new cluster CA (every node must then join again)", certPath, CAKeyFile, CAKeyFile, CACertFile)
	case !haveCert && haveKey:
		return fmt.Errorf("%s exists but %s is missing: restore %s from a backup, or move %s aside to create a new cluster CA (every node must then join again)", keyPath, CACertFile, CACertFile, CAKeyFile)
	}
	cert, err := readCertFile(certPath)
	if err != nil {
		return fmt.Errorf("%w: restore it from a backup, or move %s and %s aside to create a new cluster CA", err, CACertFile, CAKeyFile)
	}
	key, err := readKeyFile(keyPath)
	if err != nil {
		return err
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return fmt.Errorf("%s is not a CA certificate: restore the cluster CA from a backup, or move %s and %s aside to create a new one", certPath, CACertFile, CAKeyFile)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return fmt.Errorf("%s does not match %s (the key is not the certificate's): restore the matching pair from a backup", keyPath, certPath)
	}
	if now := a.now(); now.After(cert.NotAfter) {
		return fmt.Errorf("cluster CA %s expired at %s: move %s and %s aside to create a new CA; every node must then join again", certPath, cert.NotAfter.UTC().Format(time.RFC3339), CACertFile, CAKeyFile)
	} else if cert.NotAfter.Sub(now) < renewBefore {
		a.log.Warn("cluster CA expires soon", "path", certPath, "not_after", cert.NotAfter)
	}
	a.setCA(cert, key)
	return nil
}

func (a *Authority) createCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate CA key: %w", err)
	}
	now := a.now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "gpuctl cluster CA", Organization: []string{"gpuctl"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if tmpl.SerialNumber, err = serialNumber(); err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parse new CA certificate: %w", err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return err
	}
	// The key goes first: a crash between the two writes leaves a key
	// without a certificate, which is refused with a message, never reused
	// under a new certificate.
	if err := writeFileNew(a.path(CAKeyFile), kp, 0o600); err != nil {
		return err
	}
	if err := writeFileNew(a.path(CACertFile), certPEM(der), 0o644); err != nil {
		return err
	}
	a.setCA(cert, key)
	a.log.Info("created cluster CA", "path", a.path(CACertFile), "sha256", a.CAHash())
	return nil
}

func (a *Authority) setCA(cert *x509.Certificate, key crypto.Signer) {
	a.caCert = cert
	a.caKey = key
	a.caPool = x509.NewCertPool()
	a.caPool.AddCert(cert)
	a.caHash = sha256.Sum256(cert.Raw)
}

func (a *Authority) loadOrCreateSecret() error {
	path := a.path(TokenSecretFile)
	have, err := exists(path)
	if err != nil {
		return err
	}
	if !have {
		secret := make([]byte, tokenSecretSize)
		if _, err := rand.Read(secret); err != nil {
			return fmt.Errorf("generate join-token secret: %w", err)
		}
		if err := writeFileNew(path, secret, 0o600); err != nil {
			return err
		}
		a.secret = secret
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s has mode %#o and is readable by other users: run chmod 600 %s", path, perm, path)
	}
	secret, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(secret) != tokenSecretSize {
		return fmt.Errorf("%s holds %d bytes, want %d: the file is corrupt; remove it to make a new secret (join tokens issued so far stop working)", path, len(secret), tokenSecretSize)
	}
	a.secret = secret
	return nil
}

// RevokeTokens replaces the join-token secret, so every token created so far
// is refused with ErrTokenBadSignature.
func (a *Authority) RevokeTokens() error {
	secret := make([]byte, tokenSecretSize)
	if _, err := rand.Read(secret); err != nil {
		return fmt.Errorf("revoke tokens: generate secret: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := replaceFile(a.path(TokenSecretFile), secret, 0o600); err != nil {
		return fmt.Errorf("revoke tokens: %w", err)
	}
	a.secret = secret
	a.log.Info("revoked all join tokens", "path", a.path(TokenSecretFile))
	return nil
}

// serverNames splits extra names into DNS names and IP addresses and adds
// the loopback names and the host name.
func serverNames(extra []string) ([]string, []net.IP, error) {
	dns := []string{"localhost"}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}
	if host, err := os.Hostname(); err == nil && host != "" && host != "localhost" {
		dns = append(dns, host)
	}
	for _, n := range extra {
		n = strings.TrimSpace(n)
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
			continue
		}
		if n == "" || strings.ContainsAny(n, ":/ \t*") {
			return nil, nil, fmt.Errorf("server name %q is neither a DNS name nor an IP address (give the host without a port)", n)
		}
		if !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	return dns, ips, nil
}

func (a *Authority) loadOrCreateServer(dns []string, ips []net.IP) error {
	certPath, keyPath := a.path(ServerCertFile), a.path(ServerKeyFile)
	haveCert, err := exists(certPath)
	if err != nil {
		return err
	}
	haveKey, err := exists(keyPath)
	if err != nil {
		return err
	}
	var key crypto.Signer
	switch {
	case haveCert && !haveKey:
		return fmt.Errorf("%s exists but %s is missing: move %s aside and restart to have a new server key and certificate issued", certPath, ServerKeyFile, ServerCertFile)
	case !haveKey:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generate server key: %w", err)
		}
		kp, err := keyPEM(k)
		if err != nil {
			return err
		}
		if err := writeFileNew(keyPath, kp, 0o600); err != nil {
			return err
		}
		key = k
	default:
		if key, err = readKeyFile(keyPath); err != nil {
			return err
		}
	}

	reason := "first start"
	if haveCert {
		cert, err := readCertFile(certPath)
		if err != nil {
			return fmt.Errorf("%w: move %s aside and restart to have a new one issued", err, ServerCertFile)
		}
		if !publicKeysEqual(cert.PublicKey, key.Public()) {
			return fmt.Errorf("%s does not match %s: move %s aside and restart to have a new one issued for the key", certPath, keyPath, ServerCertFile)
		}
		if err := cert.CheckSignatureFrom(a.caCert); err != nil {
			return fmt.Errorf("%s is not signed by %s (%v): move %s aside and restart to have a new one issued", certPath, CACertFile, err, ServerCertFile)
		}
		reason = serverCertStale(cert, dns, ips, a.now())
		if reason == "" {
			a.server = tls.Certificate{Certificate: [][]byte{cert.Raw, a.caCert.Raw}, PrivateKey: key, Leaf: cert}
			return nil
		}
	}
	cert, err := a.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "gpuctl server", OrganizationalUnit: []string{string(RoleServer)}, Organization: []string{"gpuctl"}},
		DNSNames:    dns,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, key.Public(), serverValidity)
	if err != nil {
		return fmt.Errorf("issue server certificate: %w", err)
	}
	// The certificate is derived from the key and the CA, so replacing it
	// loses nothing; the key itself is kept.
	if err := replaceFile(certPath, certPEM(cert.Raw), 0o644); err != nil {
		return err
	}
	a.log.Info("issued server certificate", "path", certPath, "reason", reason, "dns", dns, "ips", ips, "not_after", cert.NotAfter)
	a.server = tls.Certificate{Certificate: [][]byte{cert.Raw, a.caCert.Raw}, PrivateKey: key, Leaf: cert}
	return nil
}

// serverCertStale says why cert must be reissued, or "" when it is fine.
func serverCertStale(cert *x509.Certificate, dns []string, ips []net.IP, now time.Time) string {
	if cert.NotAfter.Sub(now) < renewBefore {
		return "expires " + cert.NotAfter.UTC().Format(time.RFC3339)
	}
	for _, n := range dns {
		if !slices.Contains(cert.DNSNames, n) {
			return "add name " + n
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return "add address " + ip.String()
		}
	}
	return ""
}

func (a *Authority) sign(tmpl *x509.Certificate, pub crypto.PublicKey, ttl time.Duration) (*x509.Certificate, error) {
	now := a.now()
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(ttl)
	if tmpl.NotAfter.After(a.caCert.NotAfter) {
		tmpl.NotAfter = a.caCert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.caCert, pub, a.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}

// IssueNode signs a node certificate for pub, the public key a node
// generated (ECDSA P-256/P-384 or Ed25519), under the node's name.
func (a *Authority) IssueNode(pub crypto.PublicKey, name string) (*x509.Certificate, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("issue node certificate: %w", err)
	}
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", name, err)
	}
	cert, err := a.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{string(RoleNode)}, Organization: []string{"gpuctl"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, pub, a.nodeTTL)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", name, err)
	}
	return cert, nil
}

// IssueClient generates a key and a client certificate with the given role
// (viewer, operator or admin) and returns them as an Identity.
func (a *Authority) IssueClient(name string, role Role) (*Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue client certificate for %s: generate key: %w", name, err)
	}
	cert, err := a.IssueClientFor(key.Public(), name, role)
	if err != nil {
		return nil, err
	}
	return newIdentity(cert, key, a.caCert)
}

// IssueClientFor signs a client certificate with the given role for pub, a
// key the client generated and keeps.
func (a *Authority) IssueClientFor(pub crypto.PublicKey, name string, role Role) (*x509.Certificate, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("issue client certificate: %w", err)
	}
	if !role.IsClient() {
		return nil, fmt.Errorf("issue client certificate for %s: role %q is not a client role: use viewer, operator or admin", name, role)
	}
	if err := checkPublicKey(pub); err != nil {
		return nil, fmt.Errorf("issue client certificate for %s: %w", name, err)
	}
	cert, err := a.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{string(role)}, Organization: []string{"gpuctl"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, pub, a.clientTTL)
	if err != nil {
		return nil, fmt.Errorf("issue client certificate for %s: %w", name, err)
	}
	return cert, nil
}

// Serial returns a certificate's serial number as the deny-list keeps it:
// lowercase hex.
func Serial(cert *x509.Certificate) string {
	if cert == nil || cert.SerialNumber == nil {
		return ""
	}
	return cert.SerialNumber.Text(16)
}

// KeySHA256 returns the lowercase hex SHA-256 of a public key's PKIX DER
// encoding, which names a key across certificates.
func KeySHA256(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%x", sha256.Sum256(der))
}

// CACert returns the cluster CA certificate.
func (a *Authority) CACert() *x509.Certificate { return a.caCert }

// CAHash returns the lowercase hex SHA-256 of the CA certificate's DER
// bytes, the pin a join token carries.
func (a *Authority) CAHash() string { return fmt.Sprintf("%x", a.caHash) }

// ServerCertificate returns the server's certificate chain and key.
func (a *Authority) ServerCertificate() tls.Certificate { return a.server }

// Dir returns the data dir the authority lives in.
func (a *Authority) Dir() string { return a.dir }

// VerifyPeer checks that chain (leaf first) was issued by this CA for the
// given key usage and is valid now, and returns the role and name it carries.
func (a *Authority) VerifyPeer(chain []*x509.Certificate) (Role, string, error) {
	return verifyChain(chain, a.caPool, x509.ExtKeyUsageClientAuth, a.now())
}

func verifyChain(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, now time.Time) (Role, string, error) {
	if len(chain) == 0 {
		return "", "", errors.New("no certificate presented")
	}
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		var inv x509.CertificateInvalidError
		var unknown x509.UnknownAuthorityError
		switch {
		case errors.As(err, &inv) && inv.Reason == x509.Expired:
			if now.After(leaf.NotAfter) {
				fix := "ask the cluster admin for a new client config"
				if role, _, _ := RoleOf(leaf); role == RoleNode {
					fix = "join the node again with a new token"
				}
				return "", "", fmt.Errorf("certificate %q expired at %s: %s", leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339), fix)
			}
			return "", "", fmt.Errorf("certificate %q is not valid until %s: check this host's clock", leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339))
		case errors.As(err, &unknown):
			return "", "", fmt.Errorf("certificate %q was not issued by this cluster's CA: use a certificate from this cluster (nodes: join with a token from this server)", leaf.Subject.CommonName)
		}
		return "", "", fmt.Errorf("certificate %q: %w", leaf.Subject.CommonName, err)
	}
	return RoleOf(leaf)
}

func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return fmt.Errorf("ECDSA key on curve %s: use P-256 or P-384", k.Curve.Params().Name)
		}
		return nil
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return errors.New("malformed Ed25519 public key")
		}
		return nil
	}
	return fmt.Errorf("public key of type %T: use ECDSA P-256 or Ed25519", pub)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
