package etcdstore

import (
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// LoadOrCreateSecret returns the secret called name, creating it with
// create when it does not exist. It is not fenced: every server, standby
// or not, bootstraps the shared cluster CA with it before an election. Of
// servers racing to create it, one wins the create-if-absent transaction
// and all get its bytes.
func (s *Store) LoadOrCreateSecret(name string, create func() ([]byte, error)) ([]byte, error) {
	key := s.k.secret(name)
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("etcd store: load secret %s: %w", name, err)
	}
	if len(resp.Kvs) == 1 {
		return resp.Kvs[0].Value, nil
	}
	v, err := create()
	if err != nil {
		return nil, fmt.Errorf("etcd store: create secret %s: %w", name, err)
	}
	tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(v))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd store: store secret %s: %w", name, err)
	}
	if tr.Succeeded {
		return v, nil
	}
	kvs := tr.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) != 1 {
		return nil, fmt.Errorf("etcd store: secret %s: created by another server, then gone", name)
	}
	return kvs[0].Value, nil
}
