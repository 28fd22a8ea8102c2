package store

import (
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// Buckets of identities and join tokens. Like jobs, they are created by
// the first write, so a store written before them opens unchanged.
var (
	bucketIdentities = []byte("identities") // certificate serial → api.Identity
	bucketRevoked    = []byte("revoked")    // certificate serial → api.Revocation: the deny-list
	bucketTokens     = []byte("tokens")     // join token id → api.JoinToken
)

// IdentityStore keeps the certificates the cluster CA issued, the
// deny-list of revoked serials the server checks at every handshake, and
// the records of join tokens.
type IdentityStore interface {
	// PutIdentity creates or replaces the record of one certificate.
	PutIdentity(id *api.Identity) error
	// Identity returns the record of the certificate with serial, or ErrNotFound.
	Identity(serial string) (*api.Identity, error)
	// Identities returns the records of kind (every kind for
	// UNSPECIFIED), sorted by name then issue time.
	Identities(kind api.IdentityKind) ([]*api.Identity, error)
	// RevokeIdentities revokes every certificate of kind and name not
	// revoked yet, putting their serials on the deny-list, and returns
	// them; ErrNotFound when there is none.
	RevokeIdentities(kind api.IdentityKind, name string, r *api.Revocation) ([]*api.Identity, error)
	// RevokeSerial puts one serial on the deny-list (a certificate the
	// store has no record of).
	RevokeSerial(r *api.Revocation) error
	// Revocation returns the deny-list entry of serial, or ErrNotFound.
	Revocation(serial string) (*api.Revocation, error)
	// RemoveNode revokes every certificate of node name and deletes the
	// node's record, in one transaction; ErrNotFound when the store knows
	// neither.
	RemoveNode(name string, r *api.Revocation) ([]*api.Identity, error)
	// PutToken records a new join token.
	PutToken(t *api.JoinToken) error
	// UpdateToken loads the record of token id (nil when there is none),
	// lets update change it or refuse with an error, and stores it, in one
	// transaction.
	UpdateToken(id string, update func(t *api.JoinToken) error) (*api.JoinToken, error)
	// Tokens returns every join token record, newest first.
	Tokens() ([]*api.JoinToken, error)
}

var _ IdentityStore = (*Bolt)(nil)

// PutIdentity creates or replaces the record of one certificate.
func (s *Bolt) PutIdentity(id *api.Identity) error {
	if id.GetSerial() == "" || id.GetName() == "" {
		return fmt.Errorf("put identity: record lacks a serial or a name")
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return putProto(tx, bucketIdentities, id.GetSerial(), id)
	}); err != nil {
		return fmt.Errorf("put identity %s (serial %s): %w", id.GetName(), id.GetSerial(), err)
	}
	return nil
}

// Identity returns the record of the certificate with serial.
func (s *Bolt) Identity(serial string) (*api.Identity, error) {
	id := &api.Identity{}
	err := s.db.View(func(tx *bolt.Tx) error { return getProto(tx, bucketIdentities, serial, id) })
	if err != nil {
		return nil, fmt.Errorf("identity %s: %w", serial, err)
	}
	return id, nil
}

// Identities returns the records of kind, sorted by name then issue time.
func (s *Bolt) Identities(kind api.IdentityKind) ([]*api.Identity, error) {
	var out []*api.Identity
	err := s.db.View(func(tx *bolt.Tx) error {
		return forEachProto(tx, bucketIdentities, func() proto.Message { return &api.Identity{} }, func(m proto.Message) {
			if id := m.(*api.Identity); kind == api.IdentityKind_IDENTITY_KIND_UNSPECIFIED || id.GetKind() == kind {
				out = append(out, id)
			}
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list identities: %w", err)
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

// RevokeIdentities revokes every live certificate of kind and name.
func (s *Bolt) RevokeIdentities(kind api.IdentityKind, name string, r *api.Revocation) ([]*api.Identity, error) {
	var revoked []*api.Identity
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		revoked, err = revokeLocked(tx, kind, name, r)
		if err == nil && len(revoked) == 0 {
			return fmt.Errorf("no %s called %q holds a certificate that is not revoked: %w", KindName(kind), name, ErrNotFound)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("revoke %s %s: %w", KindName(kind), name, err)
	}
	return revoked, nil
}

func revokeLocked(tx *bolt.Tx, kind api.IdentityKind, name string, r *api.Revocation) ([]*api.Identity, error) {
	var live []*api.Identity
	err := forEachProto(tx, bucketIdentities, func() proto.Message { return &api.Identity{} }, func(m proto.Message) {
		if id := m.(*api.Identity); id.GetKind() == kind && id.GetName() == name && id.GetRevokedUnixNano() == 0 {
			live = append(live, id)
		}
	})
	if err != nil {
		return nil, err
	}
	for _, id := range live {
		id.RevokedUnixNano, id.RevokedBy, id.RevokeReason = r.GetRevokedUnixNano(), r.GetRevokedBy(), r.GetReason()
		if err := putProto(tx, bucketIdentities, id.GetSerial(), id); err != nil {
			return nil, err
		}
		entry := &api.Revocation{Serial: id.GetSerial(), Kind: kind, Name: name,
			RevokedUnixNano: r.GetRevokedUnixNano(), RevokedBy: r.GetRevokedBy(), Reason: r.GetReason()}
		if err := putProto(tx, bucketRevoked, id.GetSerial(), entry); err != nil {
			return nil, err
		}
	}
	return live, nil
}

// RevokeSerial puts one serial on the deny-list.
func (s *Bolt) RevokeSerial(r *api.Revocation) error {
	if r.GetSerial() == "" {
		return fmt.Errorf("revoke: no serial")
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return putProto(tx, bucketRevoked, r.GetSerial(), r)
	}); err != nil {
		return fmt.Errorf("revoke serial %s: %w", r.GetSerial(), err)
	}
	return nil
}

// Revocation returns the deny-list entry of serial, or ErrNotFound.
func (s *Bolt) Revocation(serial string) (*api.Revocation, error) {
	r := &api.Revocation{}
	if err := s.db.View(func(tx *bolt.Tx) error { return getProto(tx, bucketRevoked, serial, r) }); err != nil {
		return nil, err
	}
	return r, nil
}

// RemoveNode revokes node name's certificates and deletes its record.
func (s *Bolt) RemoveNode(name string, r *api.Revocation) ([]*api.Identity, error) {
	var revoked []*api.Identity
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if revoked, err = revokeLocked(tx, api.IdentityKind_IDENTITY_KIND_NODE, name, r); err != nil {
			return err
		}
		nodes := tx.Bucket(bucketNodes)
		known := nodes.Get([]byte(name)) != nil
		if !known && len(revoked) == 0 {
			return fmt.Errorf("no node called %q is known: %w", name, ErrNotFound)
		}
		return nodes.Delete([]byte(name))
	})
	if err != nil {
		return nil, fmt.Errorf("remove node %s: %w", name, err)
	}
	return revoked, nil
}

// PutToken records a new join token.
func (s *Bolt) PutToken(t *api.JoinToken) error {
	if t.GetId() == "" {
		return fmt.Errorf("put join token: record has no id")
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return putProto(tx, bucketTokens, t.GetId(), t) }); err != nil {
		return fmt.Errorf("put join token %s: %w", t.GetId(), err)
	}
	return nil
}

// UpdateToken changes the record of token id in one transaction.
func (s *Bolt) UpdateToken(id string, update func(*api.JoinToken) error) (*api.JoinToken, error) {
	var rec *api.JoinToken
	var refused error
	err := s.db.Update(func(tx *bolt.Tx) error {
		t := &api.JoinToken{}
		switch err := getProto(tx, bucketTokens, id, t); {
		case err == nil:
			rec = t
		case !isNotFound(err):
			return err
		}
		if refused = update(rec); refused != nil {
			return refused
		}
		if rec == nil {
			return nil
		}
		return putProto(tx, bucketTokens, id, rec)
	})
	if refused != nil {
		return rec, refused
	}
	if err != nil {
		return rec, fmt.Errorf("update join token %s: %w", id, err)
	}
	return rec, nil
}

// Tokens returns every join token record, newest first.
func (s *Bolt) Tokens() ([]*api.JoinToken, error) {
	var out []*api.JoinToken
	err := s.db.View(func(tx *bolt.Tx) error {
		return forEachProto(tx, bucketTokens, func() proto.Message { return &api.JoinToken{} }, func(m proto.Message) {
			out = append(out, m.(*api.JoinToken))
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list join tokens: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].GetCreatedUnixNano() > out[j].GetCreatedUnixNano() })
	return out, nil
}

// KindName is an identity kind in the words errors use.
func KindName(k api.IdentityKind) string {
	switch k {
	case api.IdentityKind_IDENTITY_KIND_USER:
		return "user"
	case api.IdentityKind_IDENTITY_KIND_NODE:
		return "node"
	}
	return "identity"
}

func putProto(tx *bolt.Tx, bucket []byte, key string, m proto.Message) error {
	b, err := tx.CreateBucketIfNotExists(bucket)
	if err != nil {
		return err
	}
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), v)
}

func getProto(tx *bolt.Tx, bucket []byte, key string, m proto.Message) error {
	var v []byte
	if b := tx.Bucket(bucket); b != nil {
		v = b.Get([]byte(key))
	}
	if v == nil {
		return ErrNotFound
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return fmt.Errorf("decode %s %s: %w", bucket, key, err)
	}
	return nil
}

func forEachProto(tx *bolt.Tx, bucket []byte, mk func() proto.Message, fn func(proto.Message)) error {
	b := tx.Bucket(bucket)
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		m := mk()
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("decode %s %s: %w", bucket, k, err)
		}
		fn(m)
		return nil
	})
}

func isNotFound(err error) bool { return err == ErrNotFound }
