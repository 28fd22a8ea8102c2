package etcdstore

import (
	"errors"
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

func (s *Store) putOne(key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	_, err = s.txn(nil, []clientv3.Op{clientv3.OpPut(key, string(v))})
	return err
}

// PutIdentity creates or replaces the record of one certificate.
func (s *Store) PutIdentity(id *api.Identity) error {
	if id.GetSerial() == "" || id.GetName() == "" {
		return fmt.Errorf("etcd store: put identity: record lacks a serial or a name")
	}
	if err := s.putOne(s.k.identity(id.GetSerial()), id); err != nil {
		return fmt.Errorf("etcd store: put identity %s (serial %s): %w", id.GetName(), id.GetSerial(), err)
	}
	return nil
}

// Identity returns the record of the certificate with serial.
func (s *Store) Identity(serial string) (*api.Identity, error) {
	id := &api.Identity{}
	if _, err := s.get(s.k.identity(serial), id); err != nil {
		return nil, fmt.Errorf("etcd store: identity %s: %w", serial, err)
	}
	return id, nil
}

// Identities returns the records of kind, sorted by name then issue time.
func (s *Store) Identities(kind api.IdentityKind) ([]*api.Identity, error) {
	all, _, err := list(s, s.k.identities(), func() *api.Identity { return &api.Identity{} })
	if err != nil {
		return nil, fmt.Errorf("etcd store: list identities: %w", err)
	}
	var out []*api.Identity
	for _, id := range all {
		if kind == api.IdentityKind_IDENTITY_KIND_UNSPECIFIED || id.GetKind() == kind {
			out = append(out, id)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GetName() != b.GetName() {
			return a.GetName() < b.GetName()
		}
		return a.GetIssuedUnixNano() < b.GetIssuedUnixNano()
	})
	return out, nil
}

// revokeOps reads the live certificates of kind and name and returns the
// writes that revoke them, with the compare that no identity changed
// since the read (identities are never deleted, so a range compare on
// their mod revisions sees every change).
func (s *Store) revokeOps(kind api.IdentityKind, name string, r *api.Revocation) ([]*api.Identity, []clientv3.Op, clientv3.Cmp, error) {
	all, rev, err := list(s, s.k.identities(), func() *api.Identity { return &api.Identity{} })
	if err != nil {
		return nil, nil, clientv3.Cmp{}, err
	}
	var live []*api.Identity
	var ops []clientv3.Op
	for _, id := range all {
		if id.GetKind() != kind || id.GetName() != name || id.GetRevokedUnixNano() != 0 {
			continue
		}
		id.RevokedUnixNano, id.RevokedBy, id.RevokeReason = r.GetRevokedUnixNano(), r.GetRevokedBy(), r.GetReason()
		entry := &api.Revocation{Serial: id.GetSerial(), Kind: kind, Name: name,
			RevokedUnixNano: r.GetRevokedUnixNano(), RevokedBy: r.GetRevokedBy(), Reason: r.GetReason()}
		iv, err := proto.Marshal(id)
		if err != nil {
			return nil, nil, clientv3.Cmp{}, err
		}
		ev, err := proto.Marshal(entry)
		if err != nil {
			return nil, nil, clientv3.Cmp{}, err
		}
		live = append(live, id)
		ops = append(ops, clientv3.OpPut(s.k.identity(id.GetSerial()), string(iv)), clientv3.OpPut(s.k.revoked(id.GetSerial()), string(ev)))
	}
	if len(ops)+1 > s.opts.MaxTxnOps {
		return nil, nil, clientv3.Cmp{}, fmt.Errorf("%d certificates are more than one transaction of --max-txn-ops %d can revoke", len(live), s.opts.MaxTxnOps)
	}
	unchanged := clientv3.Compare(clientv3.ModRevision(s.k.identities()), "<", rev+1).WithPrefix()
	return live, ops, unchanged, nil
}

// RevokeIdentities revokes every live certificate of kind and name.
func (s *Store) RevokeIdentities(kind api.IdentityKind, name string, r *api.Revocation) ([]*api.Identity, error) {
	var revoked []*api.Identity
	err := s.retry(func() error {
		live, ops, unchanged, err := s.revokeOps(kind, name, r)
		if err != nil {
			return err
		}
		if len(live) == 0 {
			return fmt.Errorf("no %s called %q holds a certificate that is not revoked: %w", store.KindName(kind), name, store.ErrNotFound)
		}
		if _, err := s.txn([]clientv3.Cmp{unchanged}, ops); err != nil {
			return err
		}
		revoked = live
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("etcd store: revoke %s %s: %w", store.KindName(kind), name, err)
	}
	return revoked, nil
}

// RevokeSerial puts one serial on the deny-list.
func (s *Store) RevokeSerial(r *api.Revocation) error {
	if r.GetSerial() == "" {
		return fmt.Errorf("etcd store: revoke: no serial")
	}
	if err := s.putOne(s.k.revoked(r.GetSerial()), r); err != nil {
		return fmt.Errorf("etcd store: revoke serial %s: %w", r.GetSerial(), err)
	}
	return nil
}

// Revocation returns the deny-list entry of serial, or store.ErrNotFound.
func (s *Store) Revocation(serial string) (*api.Revocation, error) {
	r := &api.Revocation{}
	if _, err := s.get(s.k.revoked(serial), r); err != nil {
		return nil, fmt.Errorf("etcd store: revocation %s: %w", serial, err)
	}
	return r, nil
}

// RemoveNode revokes node name's certificates and deletes its record, in
// one transaction.
func (s *Store) RemoveNode(name string, r *api.Revocation) ([]*api.Identity, error) {
	var revoked []*api.Identity
	err := s.retry(func() error {
		nodeKey := s.k.node(name)
		if err := s.unreachable(); err != nil {
			return err
		}
		ctx, cancel := s.reqCtx()
		resp, err := s.cli.Get(ctx, nodeKey, clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return err
		}
		var nodeRev int64
		if len(resp.Kvs) == 1 {
			nodeRev = resp.Kvs[0].ModRevision
		}
		live, ops, unchanged, err := s.revokeOps(api.IdentityKind_IDENTITY_KIND_NODE, name, r)
		if err != nil {
			return err
		}
		if nodeRev == 0 && len(live) == 0 {
			return fmt.Errorf("no node called %q is known: %w", name, store.ErrNotFound)
		}
		ops = append(ops, clientv3.OpDelete(nodeKey))
		if _, err := s.txn([]clientv3.Cmp{unchanged, clientv3.Compare(clientv3.ModRevision(nodeKey), "=", nodeRev)}, ops); err != nil {
			return err
		}
		revoked = live
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("etcd store: remove node %s: %w", name, err)
	}
	return revoked, nil
}

// PutToken records a new join token.
func (s *Store) PutToken(t *api.JoinToken) error {
	if t.GetId() == "" {
		return fmt.Errorf("etcd store: put join token: record has no id")
	}
	if err := s.putOne(s.k.token(t.GetId()), t); err != nil {
		return fmt.Errorf("etcd store: put join token %s: %w", t.GetId(), err)
	}
	return nil
}

// UpdateToken loads token id (nil when there is none), lets update change
// it or refuse, and stores it under a compare of the revision it read,
// reading again when another write came between.
func (s *Store) UpdateToken(id string, update func(*api.JoinToken) error) (*api.JoinToken, error) {
	var rec *api.JoinToken
	var refused error
	key := s.k.token(id)
	err := s.retry(func() error {
		rec, refused = nil, nil
		t := &api.JoinToken{}
		modRev, err := s.get(key, t)
		switch {
		case err == nil:
			rec = t
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		if refused = update(rec); refused != nil {
			return nil
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", modRev)}
		var ops []clientv3.Op
		if rec != nil {
			v, err := proto.Marshal(rec)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(key, string(v)))
		}
		_, err = s.txn(cmps, ops)
		return err
	})
	if refused != nil {
		return rec, refused
	}
	if err != nil {
		return rec, fmt.Errorf("etcd store: update join token %s: %w", id, err)
	}
	return rec, nil
}

// Tokens returns every join token record, newest first.
func (s *Store) Tokens() ([]*api.JoinToken, error) {
	out, _, err := list(s, s.k.tokens(), func() *api.JoinToken { return &api.JoinToken{} })
	if err != nil {
		return nil, fmt.Errorf("etcd store: list join tokens: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].GetCreatedUnixNano() > out[j].GetCreatedUnixNano() })
	return out, nil
}
