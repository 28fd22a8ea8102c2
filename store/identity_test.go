package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestIdentitiesAndDenyList(t *testing.T) {
	s, path := openTest(t)
	user := api.IdentityKind_IDENTITY_KIND_USER
	nodeKind := api.IdentityKind_IDENTITY_KIND_NODE
	for i, id := range []*api.Identity{
		{Kind: user, Name: "bob", Role: "viewer", Serial: "b1", IssuedUnixNano: 2},
		{Kind: user, Name: "alice", Role: "admin", Serial: "a1", IssuedUnixNano: 1},
		{Kind: user, Name: "bob", Role: "operator", Serial: "b2", IssuedUnixNano: 3},
		{Kind: nodeKind, Name: "node-01", Role: "node", Serial: "n1", IssuedUnixNano: 4},
	} {
		if err := s.PutIdentity(id); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := s.PutIdentity(&api.Identity{Name: "x"}); err == nil {
		t.Error("an identity without a serial was stored")
	}
	users, err := s.Identities(user)
	if err != nil {
		t.Fatal(err)
	}
	if got := serials(users); got != "a1 b1 b2" {
		t.Fatalf("users in order: %s, want a1 b1 b2", got)
	}
	r := &api.Revocation{RevokedUnixNano: 10, RevokedBy: "alice", Reason: "left"}
	revoked, err := s.RevokeIdentities(user, "bob", r)
	if err != nil || serials(revoked) != "b1 b2" {
		t.Fatalf("RevokeIdentities = %v, %v", revoked, err)
	}
	if _, err := s.RevokeIdentities(user, "bob", r); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoking bob twice: %v, want ErrNotFound", err)
	}
	for _, serial := range []string{"b1", "b2"} {
		e, err := s.Revocation(serial)
		if err != nil || e.GetName() != "bob" || e.GetRevokedBy() != "alice" || e.GetReason() != "left" {
			t.Errorf("deny-list entry %s = %v, %v", serial, e, err)
		}
	}
	if _, err := s.Revocation("a1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("alice is on the deny-list: %v", err)
	}

	if err := s.PutNode(node("node-01", api.NodeState_NODE_STATE_READY)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNode(node("node-02", api.NodeState_NODE_STATE_DOWN)); err != nil {
		t.Fatal(err)
	}
	if revoked, err := s.RemoveNode("node-01", r); err != nil || serials(revoked) != "n1" {
		t.Fatalf("RemoveNode(node-01) = %v, %v", revoked, err)
	}
	// A node known only by its record (it joined before identities were kept).
	if revoked, err := s.RemoveNode("node-02", r); err != nil || len(revoked) != 0 {
		t.Fatalf("RemoveNode(node-02) = %v, %v", revoked, err)
	}
	if _, err := s.RemoveNode("node-03", r); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveNode of an unknown node: %v", err)
	}
	if nodes, _ := s.Nodes(); len(nodes) != 0 {
		t.Errorf("nodes left after removal: %v", nodes)
	}

	// All of it survives a restart (and the check at open).
	s.Close()
	s2, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s2.Revocation("n1"); err != nil {
		t.Errorf("deny-list lost at reopen: %v", err)
	}
}

func TestUpdateTokenIsAtomic(t *testing.T) {
	s, _ := openTest(t)
	if err := s.PutToken(&api.JoinToken{Id: "t1", Uses: 3, CreatedUnixNano: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutToken(&api.JoinToken{Id: "t2", Uses: 1, CreatedUnixNano: 2}); err != nil {
		t.Fatal(err)
	}
	spent := errors.New("spent")
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.UpdateToken("t1", func(tok *api.JoinToken) error {
				if len(tok.GetUsed()) >= int(tok.GetUses()) {
					return spent
				}
				tok.Used = append(tok.Used, &api.JoinTokenUse{Node: fmt.Sprint("n", i), TimeUnixNano: time.Now().UnixNano()})
				return nil
			})
			if err == nil {
				mu.Lock()
				taken++
				mu.Unlock()
			} else if !errors.Is(err, spent) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if taken != 3 {
		t.Fatalf("%d uses taken of a 3-use token", taken)
	}
	rec, err := s.UpdateToken("nope", func(tok *api.JoinToken) error {
		if tok != nil {
			return errors.New("found a token that was never stored")
		}
		return spent
	})
	if rec != nil || !errors.Is(err, spent) {
		t.Fatalf("UpdateToken(unknown) = %v, %v", rec, err)
	}
	toks, err := s.Tokens()
	if err != nil || len(toks) != 2 || toks[0].GetId() != "t2" || len(toks[1].GetUsed()) != 3 {
		t.Fatalf("Tokens = %v, %v", toks, err)
	}
}

func serials(ids []*api.Identity) string {
	out := ""
	for i, id := range ids {
		if i > 0 {
			out += " "
		}
		out += id.GetSerial()
	}
	return out
}
