// Package etcdtest runs a real etcd cluster inside a test process, on
// loopback, with fast raft timing, for the etcd store's tests and
// benchmarks.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpuctl/gpuctl/store/etcdembed"
)

// Cluster is an in-process etcd cluster.
type Cluster struct {
	t       testing.TB
	mu      sync.Mutex
	cfgs    []etcdembed.Config
	members []*etcdembed.Member // nil while killed
}

// Start starts members (1, 3, 5…) and waits for them to form a cluster.
// Everything stops at the test's cleanup.
func Start(t testing.TB, members int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	t.Cleanup(c.stop)
	dir := t.TempDir()
	var err error
	// etcd takes URLs, not listeners, so ports are picked free and may be
	// taken by someone else before etcd binds them: retry with new ones.
	for try := range 5 {
		if err = c.launch(filepath.Join(dir, fmt.Sprint("try", try)), members); err == nil {
			break
		}
		c.stop()
		if !errors.Is(err, etcdembed.ErrAddrInUse) {
			break
		}
	}
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

func (c *Cluster) launch(dir string, n int) error {
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	c.cfgs, c.members = make([]etcdembed.Config, n), make([]*etcdembed.Member, n)
	var initial []string
	for i := range n {
		c.cfgs[i] = etcdembed.Config{
			Name:       fmt.Sprint("m", i),
			DataDir:    filepath.Join(dir, fmt.Sprint("m", i)),
			ClientURLs: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			PeerURLs:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			TickMs:     50, ElectionMs: 500,
			LogFile:      filepath.Join(dir, fmt.Sprintf("m%d.log", i)),
			ReadyTimeout: 30 * time.Second,
		}
		initial = append(initial, c.cfgs[i].Name+"="+c.cfgs[i].PeerURLs)
	}
	for i := range n {
		c.cfgs[i].InitialCluster = strings.Join(initial, ",")
		if c.members[i], err = etcdembed.Launch(c.cfgs[i]); err != nil {
			return err
		}
	}
	for _, m := range c.members {
		if err := m.WaitReady(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var wg sync.WaitGroup
	for i, m := range c.members {
		if m != nil {
			wg.Go(m.Close)
			c.members[i] = nil
		}
	}
	wg.Wait()
}

// Endpoints returns every member's client URL, killed ones included.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, cfg := range c.cfgs {
		out = append(out, cfg.ClientURLs)
	}
	return out
}

// Client returns a client of every endpoint, closed at the test's cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            c.Endpoints(),
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader returns the index of the member leading raft, waiting up to 10 s
// for one to be elected.
func (c *Cluster) Leader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for i, m := range c.members {
			if m != nil && m.IsRaftLeader() {
				c.mu.Unlock()
				return i
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("etcdtest: no raft leader after 10s")
	return -1
}

// Kill stops member i abruptly (etcdembed.Member.Kill: raft halts without
// handing leadership over, then its listeners close), keeping its data.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	m := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if m != nil {
		m.Kill()
	}
}

// Restart starts killed member i again from its data dir and waits until
// it serves.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	cfg := c.cfgs[i]
	cfg.ClusterState = "existing"
	var m *etcdembed.Member
	var err error
	// Its ports were just released; something else may briefly hold one.
	for try := 0; try < 20; try++ {
		if m, err = etcdembed.Start(context.Background(), cfg); !errors.Is(err, etcdembed.ErrAddrInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
	c.mu.Lock()
	c.members[i] = m
	c.mu.Unlock()
}

// KillAll kills every member (Kill): etcd is away as a whole, as after a
// crash of all its hosts or a lost quorum.
func (c *Cluster) KillAll() {
	var wg sync.WaitGroup
	for i := range c.cfgs {
		wg.Go(func() { c.Kill(i) })
	}
	wg.Wait()
}

// RestartAll starts every killed member again from its data dir and waits
// until they serve: launched together, as none is ready before a quorum
// is up.
func (c *Cluster) RestartAll() {
	c.t.Helper()
	launched := map[int]*etcdembed.Member{}
	for i, cfg := range c.cfgs {
		c.mu.Lock()
		up := c.members[i] != nil
		c.mu.Unlock()
		if up {
			continue
		}
		cfg.ClusterState = "existing"
		var m *etcdembed.Member
		var err error
		// Its ports were just released; something else may briefly hold one.
		for try := 0; try < 20; try++ {
			if m, err = etcdembed.Launch(cfg); !errors.Is(err, etcdembed.ErrAddrInUse) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
		}
		launched[i] = m
		c.mu.Lock()
		c.members[i] = m
		c.mu.Unlock()
	}
	for i, m := range launched {
		if err := m.WaitReady(context.Background()); err != nil {
			c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
		}
	}
}
