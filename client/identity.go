package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// TokenOptions are a join token's limits for CreateJoinToken.
type TokenOptions struct {
	TTL         time.Duration
	Uses        int
	Description string
}

// CreateJoinToken makes a join token good for o.Uses joins (1 when 0)
// within o.TTL, and returns it with the server's record of it.
func (c *Client) CreateJoinToken(ctx context.Context, o TokenOptions) (string, *api.JoinToken, error) {
	if o.TTL <= 0 {
		return "", nil, fmt.Errorf("create join token: --ttl %s is not positive: give how long the token may be used, e.g. --ttl 1h", o.TTL)
	}
	if o.Uses < 0 {
		return "", nil, fmt.Errorf("create join token: --uses %d: give how many nodes may join with it", o.Uses)
	}
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_CreateJoinToken{CreateJoinToken: &api.CreateJoinTokenRequest{
		TtlSeconds: int64((o.TTL + time.Second - 1) / time.Second), Uses: uint32(o.Uses), Description: o.Description}}})
	if err != nil {
		return "", nil, err
	}
	return r.GetCreateJoinToken().GetToken(), r.GetCreateJoinToken().GetInfo(), nil
}

// ListTokens returns the server's records of join tokens, newest first.
func (c *Client) ListTokens(ctx context.Context) ([]*api.JoinToken, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListTokens{ListTokens: &api.ListTokensRequest{}}})
	if err != nil {
		return nil, err
	}
	return r.GetListTokens().GetTokens(), nil
}

// RevokeToken revokes a join token by id (or whole token).
func (c *Client) RevokeToken(ctx context.Context, id string) (*api.JoinToken, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_RevokeToken{RevokeToken: &api.RevokeTokenRequest{Id: id}}})
	if err != nil {
		return nil, err
	}
	return r.GetRevokeToken().GetToken(), nil
}

// AddUser generates a key here, has the server issue a client certificate
// for it with role, and returns the identity (key included) and its record.
// The private key never leaves this process.
func (c *Client) AddUser(ctx context.Context, name string, role transport.Role) (*transport.Identity, *api.Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("add user %s: generate key: %w", name, err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("add user %s: %w", name, err)
	}
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_AddUser{AddUser: &api.AddUserRequest{Name: name, Role: string(role), PublicKeyDer: pub}}})
	if err != nil {
		return nil, nil, err
	}
	id, err := transport.NewClientIdentity(r.GetAddUser().GetCertDer(), key, r.GetAddUser().GetCaCertDer())
	if err != nil {
		return nil, nil, fmt.Errorf("add user %s: the server sent an unusable certificate: %w", name, err)
	}
	if id.Name != name || id.Role != role {
		return nil, nil, fmt.Errorf("add user %s: the server issued a certificate for %s %q", name, id.Role, id.Name)
	}
	return id, r.GetAddUser().GetUser(), nil
}

// Identities lists the certificates the server keeps of kind (users,
// nodes, or both for UNSPECIFIED).
func (c *Client) Identities(ctx context.Context, kind api.IdentityKind) ([]*api.Identity, error) {
	r, err := c.IdentityList(ctx, kind)
	return r.GetIdentities(), err
}

// IdentityList is Identities with the SSH console's keys, when it runs.
func (c *Client) IdentityList(ctx context.Context, kind api.IdentityKind) (*api.ListIdentitiesResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListIdentities{ListIdentities: &api.ListIdentitiesRequest{Kind: kind}}})
	if err != nil {
		return nil, err
	}
	return r.GetListIdentities(), nil
}

// RevokeUser revokes every certificate of user name and closes its
// connections.
func (c *Client) RevokeUser(ctx context.Context, name, reason string) (*api.RevokeUserResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_RevokeUser{RevokeUser: &api.RevokeUserRequest{Name: name, Reason: reason}}})
	if err != nil {
		return nil, err
	}
	return r.GetRevokeUser(), nil
}

// RemoveNode revokes node name's certificates, disconnects it and forgets
// it, so that the name may join again (with a new key).
func (c *Client) RemoveNode(ctx context.Context, name, reason string) (*api.RemoveNodeResponse, error) {
	return c.removeNode(ctx, &api.RemoveNodeRequest{Name: name, Reason: reason})
}

// RemoveLostNode removes node name as RemoveNode does, confirming that the
// node, lost, and its ranks are down for good: the jobs waiting for its
// fence go on without its witnesses' word.
func (c *Client) RemoveLostNode(ctx context.Context, name, reason string) (*api.RemoveNodeResponse, error) {
	return c.removeNode(ctx, &api.RemoveNodeRequest{Name: name, Reason: reason, ConfirmFenced: true})
}

func (c *Client) removeNode(ctx context.Context, req *api.RemoveNodeRequest) (*api.RemoveNodeResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_RemoveNode{RemoveNode: req}})
	if err != nil {
		return nil, err
	}
	return r.GetRemoveNode(), nil
}
