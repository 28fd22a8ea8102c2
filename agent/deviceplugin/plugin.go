// Package deviceplugin serves kubelet's device plugin API (v1beta1) for
// nodemon's GPUs as nvidia.com/gpu: it registers with the kubelet's
// Registration service, lists one device per GPU by UUID with its health
// (a GPU goes Unhealthy on the faults gpuctl's server marks it unhealthy
// for, api.GPUFault), and answers Allocate with the variables and device
// nodes naming the GPUs a container was given. A kubelet that restarts
// wipes the plugins' sockets and makes its own again: the plugin serves
// anew and registers again whenever kubelet.sock appears.
//
// One goroutine (Run) owns the plugin's state: the GPUs' health, the
// kubelet's ListAndWatch streams and the gRPC server; the streams, the
// directory watch and nodemon's events reach it as messages.
package deviceplugin

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/api"
)

// SocketName is the plugin's socket in the kubelet's directory.
const SocketName = "gpuctl-gpu.sock"

// kubeletSocket is the kubelet's Registration service in its directory.
const kubeletSocket = "kubelet.sock"

// Config is what the plugin offers and where.
type Config struct {
	// Dir is the kubelet's device plugin directory, which kubelet fixes
	// at /var/lib/kubelet/device-plugins (pluginapi.DevicePluginPath).
	Dir  string
	GPUs []GPU
	// Shared are the driver's device nodes every container with a real
	// GPU needs too (/dev/nvidiactl, /dev/nvidia-uvm…).
	Shared []string
	Log    *slog.Logger
}

// Plugin is the device plugin; Run serves it.
type Plugin struct {
	cfg   Config
	inbox chan any
	// done is closed when Run ends: no message is read after it.
	done chan struct{}
}

// The owner's messages.
type (
	// faultMsg: a GPU is unfit to run work (by UUID, or index where the
	// event names none).
	faultMsg struct {
		index        int32
		uuid, reason string
	}
	// watchMsg and unwatchMsg: a ListAndWatch stream starts or ends; ch
	// holds the latest device list not yet sent to it.
	watchMsg   struct{ ch chan []*pluginapi.Device }
	unwatchMsg struct{ ch chan []*pluginapi.Device }
	// kubeletMsg: kubelet.sock was made (a kubelet started).
	kubeletMsg struct{}
	// registeredMsg: how registering the server of generation gen went.
	registeredMsg struct {
		gen int
		err error
	}
)

// New checks cfg and makes the directory; Run serves it.
func New(cfg Config) (*Plugin, error) {
	if cfg.Dir == "" {
		return nil, errors.New("no directory given (kubelet's is " + pluginapi.DevicePluginPath + ")")
	}
	if len(cfg.GPUs) == 0 {
		return nil, errors.New("this node has no GPUs to offer the kubelet")
	}
	// Made now, so a directory that cannot be is an error at start; the
	// kubelet makes it too, if it starts first.
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Log = cfg.Log.With("device_plugin", ResourceName)
	return &Plugin{cfg: cfg, inbox: make(chan any, 64), done: make(chan struct{})}, nil
}

// Observe takes one of nodemon's events; a GPU fault makes its GPU
// Unhealthy. Run must be running (or have ended).
func (p *Plugin) Observe(e *api.Event) {
	reason, ok := api.GPUFault(e)
	if !ok {
		return
	}
	p.send(faultMsg{index: e.GetGpuIndex(), uuid: e.GetGpuUuid(), reason: reason})
}

// send hands m to the owner, unless it has ended.
func (p *Plugin) send(m any) bool {
	select {
	case p.inbox <- m:
		return true
	case <-p.done:
		return false
	}
}

// owner is Run's state.
type owner struct {
	p         *Plugin
	log       *slog.Logger
	unhealthy map[string]string
	watchers  map[chan []*pluginapi.Device]bool
	srv       *grpc.Server
	// gen counts the servers started, so a late registration answer of
	// an earlier one is not taken for the current one's.
	gen int
}

// Run serves the plugin until ctx ends: it watches the directory for the
// kubelet's socket and serves and registers whenever one appears (at
// once if there is one). An error is returned only for a directory that
// cannot be watched.
func (p *Plugin) Run(ctx context.Context) error {
	defer close(p.done)
	w, err := watchDir(p.cfg.Dir)
	if err != nil {
		return fmt.Errorf("device plugin: watch %s: %w", p.cfg.Dir, err)
	}
	defer w.Close()
	go func() {
		for name := range w.created {
			if name == kubeletSocket {
				p.send(kubeletMsg{})
			}
		}
	}()
	o := &owner{p: p, log: p.cfg.Log, unhealthy: map[string]string{}, watchers: map[chan []*pluginapi.Device]bool{}}
	// Stopping the server closes its listener, which removes the socket.
	defer o.stopServer()
	if _, err := os.Stat(filepath.Join(p.cfg.Dir, kubeletSocket)); err == nil {
		o.serve(ctx)
	} else {
		o.log.Info("waiting for the kubelet", "socket", filepath.Join(p.cfg.Dir, kubeletSocket))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-p.inbox:
			o.handle(ctx, m)
		}
	}
}

func (o *owner) handle(ctx context.Context, m any) {
	switch m := m.(type) {
	case faultMsg:
		uuid := m.uuid
		if uuid == "" {
			for _, g := range o.p.cfg.GPUs {
				if int32(g.Index) == m.index {
					uuid = g.UUID
				}
			}
		}
		if uuid == "" || o.unhealthy[uuid] != "" {
			return
		}
		o.unhealthy[uuid] = m.reason
		o.log.Warn("GPU unhealthy: the kubelet is told", "gpu", uuid, "reason", m.reason)
		devs := Devices(o.p.cfg.GPUs, o.unhealthy)
		for ch := range o.watchers {
			offer(ch, devs)
		}
	case watchMsg:
		o.watchers[m.ch] = true
		offer(m.ch, Devices(o.p.cfg.GPUs, o.unhealthy))
	case unwatchMsg:
		delete(o.watchers, m.ch)
	case kubeletMsg:
		o.log.Info("kubelet socket appeared; serving and registering again")
		o.serve(ctx)
	case registeredMsg:
		switch {
		case m.gen != o.gen:
		case m.err != nil:
			o.log.Error("could not register with the kubelet; waiting for it to start again", "err", m.err)
		default:
			o.log.Info("registered with the kubelet", "gpus", len(o.p.cfg.GPUs), "socket", filepath.Join(o.p.cfg.Dir, SocketName))
		}
	}
}

// offer leaves devs as ch's latest list, replacing one not yet sent (the
// owner is ch's only sender, so the send cannot block).
func offer(ch chan []*pluginapi.Device, devs []*pluginapi.Device) {
	select {
	case <-ch:
	default:
	}
	ch <- devs
}

// serve replaces the gRPC server with one on a fresh socket (a starting
// kubelet deletes every socket in its directory) and registers it.
func (o *owner) serve(ctx context.Context) {
	o.stopServer()
	o.gen++
	path := filepath.Join(o.p.cfg.Dir, SocketName)
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		o.log.Error("remove the old plugin socket", "err", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		o.log.Error("cannot serve the device plugin; waiting for the kubelet to start again", "err", err)
		return
	}
	o.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(o.srv, &service{p: o.p})
	go o.srv.Serve(ln)
	gen := o.gen
	go func() { o.p.send(registeredMsg{gen: gen, err: o.p.register(ctx)}) }()
}

func (o *owner) stopServer() {
	if o.srv != nil {
		o.srv.Stop()
		o.srv = nil
	}
}

// register asks the kubelet to take the plugin, retrying for a while: the
// socket appears a moment before the kubelet listens on it.
func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.cfg.Dir, kubeletSocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("kubelet socket: %w", err)
	}
	defer conn.Close()
	req := &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: SocketName, ResourceName: ResourceName,
		Options: options()}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, req)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// options: no PreStartContainer call, no preferred allocation.
func options() *pluginapi.DevicePluginOptions { return &pluginapi.DevicePluginOptions{} }

// service is the gRPC face of the plugin.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	p *Plugin
}

func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the device list now and again whenever a GPU's
// health changes, until the kubelet hangs up or the plugin stops.
func (s *service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ch := make(chan []*pluginapi.Device, 1)
	if !s.p.send(watchMsg{ch: ch}) {
		return errors.New("device plugin stopped")
	}
	defer s.p.send(unwatchMsg{ch: ch})
	for {
		select {
		case devs := <-ch:
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		case <-s.p.done:
			return nil
		}
	}
}

func (s *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		r, err := containerResponse(c.GetDevicesIds(), s.p.cfg.GPUs, s.p.cfg.Shared)
		if err != nil {
			return nil, fmt.Errorf("allocate: %w", err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

func (s *service) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (s *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// dirWatch reports the names made in a directory (inotify).
type dirWatch struct {
	f       *os.File
	created chan string
}

func watchDir(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking, so the runtime's poller waits on it and Close ends a
	// pending Read.
	w := &dirWatch{f: os.NewFile(uintptr(fd), "inotify:"+dir), created: make(chan string, 16)}
	go w.read()
	return w, nil
}

func (w *dirWatch) read() {
	defer close(w.created)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.PathMax))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for _, name := range inotifyNames(buf[:n]) {
			w.created <- name
		}
	}
}

// inotifyNames decodes the names of the inotify events in buf (each a
// struct inotify_event and its NUL-padded name). A record that does not
// fit in buf ends the list.
func inotifyNames(buf []byte) []string {
	var names []string
	for len(buf) >= unix.SizeofInotifyEvent {
		var ev unix.InotifyEvent
		ev.Len = binary.NativeEndian.Uint32(buf[unsafe.Offsetof(ev.Len):])
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if ev.Len > uint32(len(buf)) || end > len(buf) {
			break
		}
		name := buf[unix.SizeofInotifyEvent:end]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		names = append(names, string(name))
		buf = buf[end:]
	}
	return names
}

func (w *dirWatch) Close() error { return w.f.Close() }
