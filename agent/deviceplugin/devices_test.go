package deviceplugin

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/api"
)

func TestDevices(t *testing.T) {
	gpus := []GPU{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}, {UUID: "GPU-c", Index: 2}}
	for _, tc := range []struct {
		name      string
		unhealthy map[string]string
		want      []string
	}{
		{"all healthy", nil, []string{"Healthy", "Healthy", "Healthy"}},
		{"one unhealthy", map[string]string{"GPU-b": "XID 79"}, []string{"Healthy", "Unhealthy", "Healthy"}},
		{"an unknown GPU changes nothing", map[string]string{"GPU-z": "XID 79"}, []string{"Healthy", "Healthy", "Healthy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs := Devices(gpus, tc.unhealthy)
			if len(devs) != len(gpus) {
				t.Fatalf("%d devices for %d GPUs", len(devs), len(gpus))
			}
			for i, d := range devs {
				if d.ID != gpus[i].UUID || d.Health != tc.want[i] {
					t.Errorf("device %d = %s %s, want %s %s", i, d.ID, d.Health, gpus[i].UUID, tc.want[i])
				}
			}
		})
	}
}

func TestContainerResponse(t *testing.T) {
	real := []GPU{{UUID: "GPU-a", Nodes: []string{"/dev/nvidia0"}}, {UUID: "GPU-b", Nodes: []string{"/dev/nvidia3"}}}
	sim := []GPU{{UUID: "GPU-a"}, {UUID: "GPU-b"}}
	shared := []string{"/dev/nvidia-uvm", "/dev/nvidiactl"}
	for _, tc := range []struct {
		name      string
		ids       []string
		gpus      []GPU
		wantEnv   string
		wantNodes []string
		wantErr   bool
	}{
		{"real GPUs get their nodes and the shared ones", []string{"GPU-b", "GPU-a"}, real, "GPU-b,GPU-a",
			[]string{"/dev/nvidia3", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"}, false},
		{"simulated GPUs get no nodes", []string{"GPU-a", "GPU-b"}, sim, "GPU-a,GPU-b", nil, false},
		{"a GPU not on this node is refused", []string{"GPU-x"}, real, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := containerResponse(tc.ids, tc.gpus, shared)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("allocated %v", r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{VisibleDevicesEnv: tc.wantEnv, CUDAVisibleDevicesEnv: tc.wantEnv}
			if !reflect.DeepEqual(r.Envs, want) {
				t.Errorf("env %v, want %v", r.Envs, want)
			}
			var nodes []string
			for _, d := range r.Devices {
				if d.HostPath != d.ContainerPath || d.Permissions != "rw" {
					t.Errorf("device %+v: want the host's path in the container, rw", d)
				}
				nodes = append(nodes, d.HostPath)
			}
			if !reflect.DeepEqual(nodes, tc.wantNodes) {
				t.Errorf("device nodes %v, want %v", nodes, tc.wantNodes)
			}
		})
	}
}

// TestGPUsOf reads device nodes as the NVIDIA driver lays them out, in a
// directory standing for the host's root.
func TestGPUsOf(t *testing.T) {
	root := t.TempDir()
	write := func(path, data string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/driver/nvidia/gpus/0000:3b:00.0/information", "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 100\nDevice Minor: \t 2\nBus Type: \t PCIe\n")
	write("dev/nvidiactl", "")
	write("dev/nvidia-uvm", "")
	infos := []*api.GPUInfo{
		{Index: 0, Uuid: "GPU-a", PciBusId: "0000:3b:00.0"},
		{Index: 1, Uuid: "GPU-b", PciBusId: "0000:5d:00.0"}, // the driver does not list it
	}
	gpus, shared := GPUsOf(infos, root)
	want := []GPU{{UUID: "GPU-a", Index: 0, Nodes: []string{"/dev/nvidia2"}}, {UUID: "GPU-b", Index: 1}}
	if !reflect.DeepEqual(gpus, want) {
		t.Errorf("GPUs %+v, want %+v", gpus, want)
	}
	if want := []string{"/dev/nvidia-uvm", "/dev/nvidiactl"}; !reflect.DeepEqual(shared, want) {
		t.Errorf("shared nodes %v, want %v", shared, want)
	}
	gpus, shared = GPUsOf(infos, "")
	if want := []GPU{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}}; !reflect.DeepEqual(gpus, want) || shared != nil {
		t.Errorf("simulated: GPUs %+v shared %v, want %+v and none", gpus, shared, want)
	}
}

var _ pluginapi.DevicePluginServer = (*service)(nil)
