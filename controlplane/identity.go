package controlplane

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// Identities: every certificate the cluster CA issues is recorded in the
// store (users when added, nodes when they join, older certificates at
// their first connection), and revoking one puts its serial on the
// store's deny-list, which the listener consults at every handshake
// (checkPeer) before a connection reaches the server.

// identities returns the store's identity records; nil when the store
// keeps none (then nothing is recorded and nothing can be revoked).
func (s *Server) identities() store.IdentityStore {
	ids, _ := s.store.(store.IdentityStore)
	return ids
}

// wireIdentity makes the store the keeper of join token records, so a
// token's uses and revocation survive a restart.
func (s *Server) wireIdentity() {
	if ids := s.identities(); ids != nil {
		s.auth.SetTokenLedger(ids)
	}
}

// listenConfig is the listener's configuration: joins admitted and
// recorded, every connection checked against the deny-list.
func (s *Server) listenConfig() transport.ListenConfig {
	return transport.ListenConfig{Logger: s.log, OnJoin: s.admitJoin, OnJoined: s.joined, CheckPeer: s.checkPeer}
}

// checkPeer refuses a certificate on the deny-list, saying when and by whom
// it was revoked, and records a certificate the store has not seen (one
// issued before identities were kept), so that it can be revoked too. A
// deny-list that cannot be read is taken as last read (lastRead).
func (s *Server) checkPeer(_ context.Context, p transport.PeerInfo) error {
	ids := s.identities()
	if ids == nil {
		return nil
	}
	if err := s.reads.checkDenyList(ids, p); err != nil {
		return err
	}
	if s.cfg.ReadOnly.Err() != nil {
		return nil // recorded at a later connection: nothing can be written now
	}
	serial := transport.Serial(p.Cert)
	if _, err := ids.Identity(serial); errors.Is(err, store.ErrNotFound) {
		if err := ids.PutIdentity(identityOf(p.Cert, p.Role, "first connection", s.now())); err != nil {
			s.log.Warn("record identity", "name", p.Name, "serial", serial, "err", err)
		}
	}
	return nil
}

// revokedError is what a revoked peer is told.
func revokedError(role transport.Role, name string, r *api.Revocation) error {
	when := time.Unix(0, r.GetRevokedUnixNano()).UTC().Format(time.RFC3339)
	why := ""
	if r.GetReason() != "" {
		why = " (" + r.GetReason() + ")"
	}
	if role == transport.RoleNode {
		return fmt.Errorf("node %q was removed from the cluster at %s by %s%s and its certificate (serial %s) revoked: to bring this host back, move node.crt and node.key out of nodemon's identity dir and join again with a new token",
			name, when, orSomeone(r.GetRevokedBy()), why, r.GetSerial())
	}
	return fmt.Errorf("the certificate of user %q (serial %s) was revoked at %s by %s%s: ask the cluster admin for a new client config",
		name, r.GetSerial(), when, orSomeone(r.GetRevokedBy()), why)
}

func orSomeone(s string) string {
	if s == "" {
		return "an admin"
	}
	return s
}

// identityOf is the record of a certificate.
func identityOf(cert *x509.Certificate, role transport.Role, by string, now time.Time) *api.Identity {
	kind := api.IdentityKind_IDENTITY_KIND_USER
	if role == transport.RoleNode {
		kind = api.IdentityKind_IDENTITY_KIND_NODE
	}
	return &api.Identity{
		Kind: kind, Name: cert.Subject.CommonName, Role: string(role), Serial: transport.Serial(cert),
		KeySha256: transport.KeySHA256(cert.PublicKey), NotBeforeUnixNano: cert.NotBefore.UnixNano(),
		NotAfterUnixNano: cert.NotAfter.UnixNano(), IssuedUnixNano: now.UnixNano(), IssuedBy: by,
	}
}

// recordUser records a client identity the server issued itself (the
// first admin's).
func (s *Server) recordUser(id *transport.Identity, by string) {
	if ids := s.identities(); ids != nil {
		if err := ids.PutIdentity(identityOf(id.Certificate.Leaf, id.Role, by, s.now())); err != nil {
			s.log.Warn("record identity", "name", id.Name, "err", err)
		}
	}
}

// admitJoin refuses a join under the name of a node the cluster knows
// with another key: a reinstalled host must be removed first (gpuctl node
// remove), so that a stolen token cannot take over a node's name.
func (s *Server) admitJoin(_ context.Context, info transport.JoinInfo) error {
	if err := s.cfg.ReadOnly.Err(); err != nil {
		// A join writes the token ledger and the node's identity.
		return err
	}
	if err := s.nodes.Admit(info.Node); err != nil {
		return err
	}
	ids := s.identities()
	if ids == nil {
		return nil
	}
	known, err := ids.Identities(api.IdentityKind_IDENTITY_KIND_NODE)
	if err != nil {
		return fmt.Errorf("the server cannot read its identities (%v): try again", err)
	}
	live := false
	for _, id := range known {
		if id.GetName() != info.Node || id.GetRevokedUnixNano() != 0 {
			continue
		}
		live = true
		if id.GetKeySha256() != info.KeySHA256 {
			return fmt.Errorf("node %q is known to this cluster with another key (certificate serial %s, issued %s): if this host was reinstalled, run `gpuctl node remove %s` first, then join again; otherwise pick another --name",
				info.Node, id.GetSerial(), time.Unix(0, id.GetIssuedUnixNano()).UTC().Format(time.RFC3339), info.Node)
		}
	}
	if !live {
		// A node that joined before identities were kept has a record but
		// no identity: its key is unknown, so it must be removed first too.
		if _, err := s.store.Node(info.Node); err == nil {
			return fmt.Errorf("node %q is known to this cluster: if this host was reinstalled, run `gpuctl node remove %s` first, then join again; otherwise pick another --name", info.Node, info.Node)
		}
	}
	return nil
}

// joined records the certificate issued to a node that joined.
func (s *Server) joined(_ context.Context, info transport.JoinInfo, cert *x509.Certificate) error {
	ids := s.identities()
	if ids == nil {
		return nil
	}
	if err := ids.PutIdentity(identityOf(cert, transport.RoleNode, "join token "+info.TokenID, s.now())); err != nil {
		return fmt.Errorf("the server could not record the node's certificate (%v): try again", err)
	}
	s.auditEvent(info.Node, "join", "joined with token "+info.TokenID+" from "+info.Remote.String(), info.Node)
	return nil
}

// The identity and token requests; their rows in the authorization table
// (routes) give them to the admin alone.

// keeper is the store's identity records, or why there are none.
func (s *Server) keeper(c *call) (store.IdentityStore, error) {
	ids := s.identities()
	if ids == nil {
		return nil, c.fail("this server's store keeps no identities")
	}
	return ids, nil
}

func (s *Server) createJoinToken(_ context.Context, c *call) error {
	if _, err := s.keeper(c); err != nil {
		return err
	}
	r := c.req.GetCreateJoinToken()
	if r.GetTtlSeconds() <= 0 {
		return c.fail("create join token: ttl %ds is not positive: give how long the token may be used, e.g. --ttl 1h", r.GetTtlSeconds())
	}
	tok, rec, err := s.createToken(c.caller.Name, time.Duration(r.GetTtlSeconds())*time.Second, int(r.GetUses()), r.GetDescription())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_CreateJoinToken{CreateJoinToken: &api.CreateJoinTokenResponse{Token: tok, Info: rec}}})
}

func (s *Server) listTokens(_ context.Context, c *call) error {
	ids, err := s.keeper(c)
	if err != nil {
		return err
	}
	toks, err := ids.Tokens()
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListTokens{ListTokens: &api.ListTokensResponse{Tokens: toks}}})
}

func (s *Server) revokeTokenReq(_ context.Context, c *call) error {
	if _, err := s.keeper(c); err != nil {
		return err
	}
	rec, err := s.revokeToken(c.caller.Name, c.req.GetRevokeToken().GetId())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_RevokeToken{RevokeToken: &api.RevokeTokenResponse{Token: rec}}})
}

func (s *Server) addUserReq(_ context.Context, c *call) error {
	if _, err := s.keeper(c); err != nil {
		return err
	}
	r, err := s.addUser(c.caller.Name, c.req.GetAddUser())
	if err != nil {
		return c.fail("add user %s: %v", api.CleanText(c.req.GetAddUser().GetName(), 64), err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_AddUser{AddUser: r}})
}

func (s *Server) listIdentities(_ context.Context, c *call) error {
	ids, err := s.keeper(c)
	if err != nil {
		return err
	}
	kind := c.req.GetListIdentities().GetKind()
	list, err := ids.Identities(kind)
	if err != nil {
		return c.fail("%v", err)
	}
	resp := &api.ListIdentitiesResponse{Identities: list}
	if lister := s.sshKeys.Load(); lister != nil && kind != api.IdentityKind_IDENTITY_KIND_NODE {
		file, keys, err := (*lister)()
		resp.SshKeys, resp.SshKeysFile = keys, file
		if err != nil {
			resp.SshKeysError = err.Error()
		}
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListIdentities{ListIdentities: resp}})
}

// SSHKeyLister lists the SSH console's keys as its authorized-keys file
// has them now, and names the file.
type SSHKeyLister func() (file string, keys []*api.SSHKey, err error)

// SetSSHKeys makes `gpuctl user list` show the SSH console's keys beside
// the certificate users; the file stays their one owner.
func (s *Server) SetSSHKeys(l SSHKeyLister) { s.sshKeys.Store(&l) }

func (s *Server) revokeUserReq(_ context.Context, c *call) error {
	if _, err := s.keeper(c); err != nil {
		return err
	}
	r, err := s.revokeUser(c.caller.Name, c.req.GetRevokeUser())
	if err != nil {
		return c.fail("revoke user %s: %v", api.CleanText(c.req.GetRevokeUser().GetName(), 64), err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_RevokeUser{RevokeUser: r}})
}

func (s *Server) removeNodeReq(ctx context.Context, c *call) error {
	if _, err := s.keeper(c); err != nil {
		return err
	}
	r, err := s.removeNode(ctx, c.caller.Name, c.req.GetRemoveNode())
	if err != nil {
		return c.fail("remove node %s: %v", api.CleanText(c.req.GetRemoveNode().GetName(), 64), err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_RemoveNode{RemoveNode: r}})
}

// CreateJoinToken makes a join token good for uses joins (0: one) over
// ttl, recorded in the store.
func (s *Server) CreateJoinToken(ttl time.Duration, uses int, description string) (string, error) {
	tok, _, err := s.createToken("gpuctl serve", ttl, uses, description)
	return tok, err
}

func (s *Server) createToken(who string, ttl time.Duration, uses int, description string) (string, *api.JoinToken, error) {
	tok, rec, err := s.auth.IssueToken(transport.TokenOptions{TTL: ttl, Uses: uses, CreatedBy: who, Description: api.CleanText(description, 0)})
	if err != nil {
		return "", nil, err
	}
	s.log.Info("join token created", "token", rec.GetId(), "uses", rec.GetUses(), "by", who)
	return tok, rec, nil
}

func (s *Server) revokeToken(who, id string) (*api.JoinToken, error) {
	id = strings.TrimSpace(id)
	if strings.Contains(id, ".") {
		t, err := transport.ParseToken(id)
		if err != nil {
			return nil, fmt.Errorf("revoke token: %w", err)
		}
		id = t.ID
	}
	now := s.now()
	rec, err := s.identities().UpdateToken(id, func(t *api.JoinToken) error {
		switch {
		case t == nil:
			return fmt.Errorf("revoke token: no token %q is known: `gpuctl token list` shows the ids", api.CleanText(id, 64))
		case t.GetRevokedUnixNano() != 0:
			return fmt.Errorf("revoke token: token %s was revoked already, at %s by %s", id,
				time.Unix(0, t.GetRevokedUnixNano()).UTC().Format(time.RFC3339), orSomeone(t.GetRevokedBy()))
		}
		t.RevokedUnixNano, t.RevokedBy = now.UnixNano(), who
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

func (s *Server) addUser(who string, r *api.AddUserRequest) (*api.AddUserResponse, error) {
	if err := transport.ValidateName(r.GetName()); err != nil {
		return nil, err
	}
	role, err := transport.ParseRole(r.GetRole())
	if err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(r.GetPublicKeyDer())
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	ids := s.identities()
	users, err := ids.Identities(api.IdentityKind_IDENTITY_KIND_USER)
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		if u.GetName() == r.GetName() && u.GetRevokedUnixNano() == 0 {
			return nil, fmt.Errorf("user %q exists (%s, serial %s): revoke it first with `gpuctl user revoke %s`, or pick another name",
				r.GetName(), u.GetRole(), u.GetSerial(), r.GetName())
		}
	}
	cert, err := s.auth.IssueClientFor(pub, r.GetName(), role)
	if err != nil {
		return nil, err
	}
	rec := identityOf(cert, role, who, s.now())
	if err := ids.PutIdentity(rec); err != nil {
		return nil, err
	}
	return &api.AddUserResponse{User: rec, CertDer: cert.Raw, CaCertDer: s.auth.CACert().Raw}, nil
}

func (s *Server) revokeUser(who string, r *api.RevokeUserRequest) (*api.RevokeUserResponse, error) {
	name, reason := r.GetName(), api.CleanText(r.GetReason(), 0)
	if name == who {
		return nil, errors.New("that is the certificate this request came with: revoke it from another admin's config")
	}
	revoked, err := s.identities().RevokeIdentities(api.IdentityKind_IDENTITY_KIND_USER, name,
		&api.Revocation{RevokedUnixNano: s.now().UnixNano(), RevokedBy: who, Reason: reason})
	if err != nil {
		return nil, err
	}
	serials := map[string]bool{}
	for _, id := range revoked {
		serials[id.GetSerial()] = true
	}
	msg := fmt.Sprintf("your certificate was revoked by %s", who)
	if reason != "" {
		msg += " (" + reason + ")"
	}
	n := 0
	if s.ln != nil {
		n = s.ln.Disconnect(func(c *transport.Conn) bool { return c.Role().IsClient() && serials[c.Serial()] }, msg+": ask the cluster admin for a new client config")
	}
	return &api.RevokeUserResponse{Revoked: revoked, Disconnected: uint32(n)}, nil
}

// nodeGoneTimeout bounds the wait for a removed node's session to end.
const nodeGoneTimeout = 10 * time.Second

func (s *Server) removeNode(ctx context.Context, who string, r *api.RemoveNodeRequest) (*api.RemoveNodeResponse, error) {
	// Whatever the outcome, what was revoked reaches the witnesses.
	defer s.refreshDeniedPeers()
	name, reason := r.GetName(), api.CleanText(r.GetReason(), 0)
	rev := &api.Revocation{RevokedUnixNano: s.now().UnixNano(), RevokedBy: who, Reason: reason}
	ids := s.identities()
	resp := &api.RemoveNodeResponse{}
	if r.GetConfirmFenced() {
		// The fences go first: a node refused here (connected, or no job
		// waits for it) is not removed either.
		jobs, err := s.jobs.ConfirmFenced(ctx, name, who)
		if err != nil {
			return nil, err
		}
		resp.FencedJobs = jobs
	}
	if conn := s.nodes.Conn(name); conn != nil {
		// Revoke first, so that the node cannot reconnect, then end its
		// session: its jobs learn the node is down from that, and its
		// record is deleted only after the session's end wrote it.
		if _, err := ids.Identity(conn.Serial()); errors.Is(err, store.ErrNotFound) {
			// The certificate predates the identity records.
			ids.PutIdentity(identityOf(conn.Certificate(), transport.RoleNode, "first connection", s.now()))
		}
		revoked, err := ids.RevokeIdentities(api.IdentityKind_IDENTITY_KIND_NODE, name, rev)
		if err != nil {
			return nil, err
		}
		resp.Revoked, resp.WasConnected = revoked, true
		msg := fmt.Sprintf("node removed from the cluster by %s", who)
		if reason != "" {
			msg += " (" + reason + ")"
		}
		conn.CloseWithError(transport.CodeRefused, msg)
		wctx, cancel := context.WithTimeout(ctx, nodeGoneTimeout)
		defer cancel()
		for {
			if !s.nodes.Connected(name) {
				break
			}
			select {
			case <-wctx.Done():
				return nil, fmt.Errorf("its certificate is revoked, but its session did not end within %s: run the removal again", nodeGoneTimeout)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	revoked, err := ids.RemoveNode(name, rev)
	if err != nil {
		return nil, err
	}
	resp.Revoked = append(resp.Revoked, revoked...)
	s.nodes.Forget(name)
	return resp, nil
}

// refreshDeniedPeers tells the registry the node certificates revoked
// and not yet expired, for the witnesses (nodes.SetDeniedPeers). A list
// that cannot be read leaves the one nodes were told.
func (s *Server) refreshDeniedPeers() {
	ids := s.identities()
	if ids == nil {
		return
	}
	known, err := ids.Identities(api.IdentityKind_IDENTITY_KIND_NODE)
	if err != nil {
		s.log.Warn("read revoked node certificates; witnesses keep the deny-list they have", "err", err)
		return
	}
	now := s.now().UnixNano()
	var serials []string
	for _, id := range known {
		if id.GetRevokedUnixNano() != 0 && (id.GetNotAfterUnixNano() == 0 || id.GetNotAfterUnixNano() > now) {
			serials = append(serials, id.GetSerial())
		}
	}
	s.nodes.SetDeniedPeers(serials)
}

// auditEvent records an action that is no client request (a node's join)
// in the event log, as an audit event.
func (s *Server) auditEvent(who, request, result, node string) {
	e := &api.Event{TimeUnixNano: s.now().UnixNano(), Kind: api.EventKind_EVENT_KIND_AUDIT, Severity: api.Severity_SEVERITY_INFO,
		Node: node, Message: fmt.Sprintf("%s: %s: %s", who, request, result), Attrs: map[string]string{"who": who, "request": request, "result": result}}
	if err := s.store.AppendEvent(e); err != nil {
		s.log.Error("persist audit event", "request", request, "err", err)
		return
	}
	s.hub.PublishEvent(e)
}
