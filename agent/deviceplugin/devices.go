package deviceplugin

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/api"
)

// ResourceName is the extended resource the GPUs are advertised as, the
// name pods ask for and NVIDIA's plugin uses.
const ResourceName = "nvidia.com/gpu"

// The variables a container is given naming its GPUs: the NVIDIA
// container runtime's, and CUDA's (which takes UUIDs as well as indices,
// so the same value holds whether or not the runtime hides the others).
const (
	VisibleDevicesEnv     = "NVIDIA_VISIBLE_DEVICES"
	CUDAVisibleDevicesEnv = "CUDA_VISIBLE_DEVICES"
)

// GPU is one device the plugin offers.
type GPU struct {
	UUID  string
	Index uint32
	// Nodes are the GPU's character devices on the host (/dev/nvidiaN);
	// none for a simulated GPU.
	Nodes []string
}

// GPUsOf turns NVML's inventory into the GPUs offered, with the device
// nodes found under root (the host's /) and the driver's shared ones;
// root "" is a simulated host, whose GPUs have no nodes.
func GPUsOf(infos []*api.GPUInfo, root string) (gpus []GPU, shared []string) {
	for _, info := range infos {
		g := GPU{UUID: info.GetUuid(), Index: info.GetIndex()}
		if root != "" {
			g.Nodes, shared = DeviceNodes(root, info.GetPciBusId())
		}
		gpus = append(gpus, g)
	}
	return gpus, shared
}

// Devices is the list ListAndWatch sends: one device per GPU, by UUID,
// Unhealthy where unhealthy has a reason for it.
func Devices(gpus []GPU, unhealthy map[string]string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(gpus))
	for _, g := range gpus {
		health := pluginapi.Healthy
		if _, bad := unhealthy[g.UUID]; bad {
			health = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: g.UUID, Health: health})
	}
	return out
}

// containerResponse is Allocate's answer for one container given the GPUs
// ids: both variables naming them in the order asked, and the device nodes
// of those GPUs plus the driver's shared ones (control, UVM).
func containerResponse(ids []string, gpus []GPU, shared []string) (*pluginapi.ContainerAllocateResponse, error) {
	byID := make(map[string]GPU, len(gpus))
	for _, g := range gpus {
		byID[g.UUID] = g
	}
	var nodes []string
	for _, id := range ids {
		g, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("device %q is not one of this node's GPUs", id)
		}
		nodes = append(nodes, g.Nodes...)
	}
	if len(nodes) > 0 {
		nodes = append(nodes, shared...)
	}
	list := strings.Join(ids, ",")
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{VisibleDevicesEnv: list, CUDAVisibleDevicesEnv: list}}
	for _, n := range nodes {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n, HostPath: n, Permissions: "rw"})
	}
	return resp, nil
}

// DeviceNodes finds a real GPU's device node from the driver's record
// of it (root/proc/driver/nvidia/gpus/BUS/information names its minor
// number), and the driver's shared nodes that exist under root/dev. A
// GPU the driver does not list (a simulated one) has none.
func DeviceNodes(root, pciBusID string) (gpu []string, shared []string) {
	if pciBusID != "" {
		if minor, ok := deviceMinor(filepath.Join(root, "proc/driver/nvidia/gpus", strings.ToLower(pciBusID), "information")); ok {
			gpu = []string{"/dev/nvidia" + minor}
		}
	}
	for _, n := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if _, err := os.Stat(filepath.Join(root, n)); err == nil {
			shared = append(shared, n)
		}
	}
	sort.Strings(shared)
	return gpu, shared
}

// deviceMinor reads "Device Minor:" from the driver's information file.
func deviceMinor(path string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Device Minor:"); ok {
			v = strings.TrimSpace(v)
			return v, v != ""
		}
	}
	return "", false
}
