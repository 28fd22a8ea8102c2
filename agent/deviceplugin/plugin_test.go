package deviceplugin

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/api"
)

// registry stands in for the kubelet's Registration service: it records
// each request. (The plugin against a real kubelet is kubelet_test.go.)
type registry struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registry) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

// startKubelet serves a registry on dir/kubelet.sock as a starting kubelet
// does: every socket in dir is deleted first.
func startKubelet(t *testing.T, dir string) *registry {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	ln, err := net.Listen("unix", filepath.Join(dir, kubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{got: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, r)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r
}

func waitRegister(t *testing.T, r *registry) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case req := <-r.got:
		return req
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not register within 20 s")
		return nil
	}
}

// TestPluginRegistersAndReports: the plugin registers with a kubelet that
// is already there, lists its GPUs, turns one Unhealthy on a fault event,
// answers Allocate, and registers again with a kubelet started anew.
func TestPluginRegistersAndReports(t *testing.T) {
	dir := t.TempDir()
	k1 := startKubelet(t, dir)
	gpus := []GPU{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}}
	p, err := New(Config{Dir: dir, GPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	req := waitRegister(t, k1)
	if req.Version != pluginapi.Version || req.ResourceName != ResourceName || req.Endpoint != SocketName {
		t.Fatalf("registered %+v, want version %s, %s at %s", req, pluginapi.Version, ResourceName, SocketName)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := pluginapi.NewDevicePluginClient(conn)
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	stream, err := cl.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	health := func() string {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, d := range resp.Devices {
			s = append(s, d.ID+"="+d.Health)
		}
		return strings.Join(s, " ")
	}
	if got, want := health(), "GPU-a=Healthy GPU-b=Healthy"; got != want {
		t.Fatalf("devices %s, want %s", got, want)
	}
	// A fault that does not take the GPU out (XID 13: restart the
	// application) changes nothing; XID 79 on GPU 1 (by index only) does.
	p.Observe(&api.Event{Kind: api.EventKind_EVENT_KIND_XID, Xid: 13, XidClass: api.XIDClass_XID_CLASS_RESTART_APP, GpuIndex: 1})
	p.Observe(&api.Event{Kind: api.EventKind_EVENT_KIND_XID, Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE, GpuIndex: 1})
	if got, want := health(), "GPU-a=Healthy GPU-b=Unhealthy"; got != want {
		t.Fatalf("after XID 79 on GPU 1: devices %s, want %s", got, want)
	}

	resp, err := cl.Allocate(sctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs[VisibleDevicesEnv]; got != "GPU-a" {
		t.Errorf("Allocate GPU-a: %s=%q", VisibleDevicesEnv, got)
	}
	if _, err := cl.Allocate(sctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-x"}}}}); err == nil || !strings.Contains(err.Error(), "GPU-x") {
		t.Errorf("Allocate of a GPU not here: %v, want an error naming it", err)
	}

	// The kubelet restarts: its socket and the plugin's are made anew.
	k2 := startKubelet(t, dir)
	waitRegister(t, k2)
	conn2, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	stream, err = pluginapi.NewDevicePluginClient(conn2).ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := health(), "GPU-a=Healthy GPU-b=Unhealthy"; got != want {
		t.Fatalf("after the kubelet's restart: devices %s, want %s (health is kept)", got, want)
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := New(Config{GPUs: []GPU{{UUID: "GPU-a"}}}); err == nil || !strings.Contains(err.Error(), pluginapi.DevicePluginPath) {
		t.Errorf("no directory: %v, want an error naming kubelet's", err)
	}
	if _, err := New(Config{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "no GPUs") {
		t.Errorf("no GPUs: %v", err)
	}
}

// TestPluginWaitsForKubelet: with no kubelet yet, the plugin serves
// nothing; when kubelet.sock appears it serves and registers, and when
// it stops its socket is gone.
func TestPluginWaitsForKubelet(t *testing.T) {
	dir := t.TempDir()
	// The plugin's log, read line by line as it is written.
	r, w := io.Pipe()
	defer w.Close()
	waiting := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(r)
		for said := false; sc.Scan(); {
			if !said && strings.Contains(sc.Text(), "waiting for the kubelet") {
				said = true
				close(waiting)
			}
		}
	}()
	p, err := New(Config{Dir: dir, GPUs: []GPU{{UUID: "GPU-a"}}, Log: slog.New(slog.NewTextHandler(w, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not say it waits for the kubelet within 10 s")
	}
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !os.IsNotExist(err) {
		t.Errorf("plugin socket before any kubelet: %v, want none", err)
	}
	waitRegister(t, startKubelet(t, dir))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !os.IsNotExist(err) {
		t.Errorf("plugin socket after Run ended: %v, want none", err)
	}
}
