package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/internal/testbin"
)

// daemonSetPath is nodemon's DaemonSet manifest.
func daemonSetPath(t *testing.T) string {
	return filepath.Join(testbin.Root(t), "deploy", "kubernetes", "nodemon-daemonset.yaml")
}

// readDaemonSet decodes the manifest strictly: a field apps/v1 does not
// have, or one given twice, is an error.
func readDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	data, err := os.ReadFile(daemonSetPath(t))
	if err != nil {
		t.Fatal(err)
	}
	s := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	obj, _, err := s.Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("%s: %v", daemonSetPath(t), err)
	}
	ds, ok := obj.(*appsv1.DaemonSet)
	if !ok {
		t.Fatalf("%s holds a %T, want an apps/v1 DaemonSet", daemonSetPath(t), obj)
	}
	return ds
}

// nodemonArgs is the container's command line with $(VAR) references
// replaced by stand-ins; each must name a variable the container sets.
func nodemonArgs(t *testing.T, c corev1.Container) []string {
	t.Helper()
	vars := map[string]bool{}
	for _, e := range c.Env {
		vars[e.Name] = true
	}
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	var args []string
	for _, a := range c.Args {
		args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			if !vars[name] {
				t.Errorf("argument %q uses $(%s), which the container does not set", a, name)
			}
			return "standin-" + strings.ToLower(name)
		}))
	}
	return args
}

// TestDaemonSetMatchesNodemon checks the manifest against nodemon's real
// flags (parsed by nodemon's own command) and what they need mounted,
// so neither can change without the other.
func TestDaemonSetMatchesNodemon(t *testing.T) {
	ds := readDaemonSet(t)
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || !spec.HostNetwork {
		t.Errorf("hostPID %v, hostNetwork %v: nodemon traces the host's processes and flows, want both", spec.HostPID, spec.HostNetwork)
	}
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "nodemon" {
		t.Fatalf("want one container, nodemon: %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("nodemon is not privileged: its eBPF probes and NVML need it")
	}
	if len(c.Command) != 1 || c.Command[0] != "/usr/bin/nodemon" {
		t.Errorf("command %v, want /usr/bin/nodemon", c.Command)
	}
	cmd := rootCmd(func(*options) error { return nil })
	if err := cmd.ParseFlags(nodemonArgs(t, c)); err != nil {
		t.Fatalf("nodemon refuses the manifest's arguments: %v", err)
	}
	flag := func(name string) string {
		t.Helper()
		f := cmd.Flags().Lookup(name)
		if f == nil || !f.Changed {
			t.Fatalf("the manifest does not pass --%s", name)
		}
		return f.Value.String()
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if v := env["NODE_NAME"].ValueFrom; flag("name") != "standin-node_name" || v == nil || v.FieldRef == nil || v.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("--name is not the Node's name (NODE_NAME from spec.nodeName)")
	}
	server := env["GPUCTL_SERVER"].ValueFrom
	if flag("server") != "standin-gpuctl_server" || server == nil || server.SecretKeyRef == nil {
		t.Fatalf("--server is not read from a Secret (GPUCTL_SERVER)")
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mounted := map[string]corev1.Volume{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Errorf("mount %s: no volume %s", m.MountPath, m.Name)
		}
		mounted[m.MountPath] = v
	}
	hostPath := func(what, path string) {
		t.Helper()
		v, ok := mounted[path]
		if !ok || v.HostPath == nil || v.HostPath.Path != path {
			t.Errorf("%s: the host's %s is not mounted at %s", what, path, path)
		}
	}
	if got, want := flag("device-plugin-dir"), strings.TrimSuffix(pluginapi.DevicePluginPath, "/"); got != want {
		t.Errorf("--device-plugin-dir %s, want kubelet's %s", got, want)
	}
	hostPath("--device-plugin-dir", flag("device-plugin-dir"))
	// The node's identity outlives its pod.
	hostPath("--data-dir", flag("data-dir"))
	hostPath("tracefs", "/sys/kernel/tracing")
	hostPath("bpffs", "/sys/fs/bpf")
	if v := mounted[filepath.Dir(flag("token-file"))]; v.Secret == nil || v.Secret.SecretName != server.SecretKeyRef.Name {
		t.Errorf("--token-file %s is not in the Secret %s, mounted", flag("token-file"), server.SecretKeyRef.Name)
	}

	if len(spec.NodeSelector) == 0 {
		t.Errorf("no nodeSelector: nodemon would run on nodes without GPUs")
	}
	tolerates := false
	for _, tol := range spec.Tolerations {
		tolerates = tolerates || tol.Key == "nvidia.com/gpu"
	}
	if !tolerates {
		t.Errorf("no toleration of the nvidia.com/gpu taint GPU nodes often carry")
	}
}
