package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// EnvContext names the environment variable that picks a client
// config's context (gpuctl --context sets it for the command).
const EnvContext = "GPUCTL_CONTEXT"

// A client config may hold several clusters, as kubectl's does: a list
// of contexts, each a whole client config with a name, and the one used
// when none is named:
//
//	current_context: prod
//	contexts:
//	  - name: prod
//	    server: head-a:7443,head-b:7443
//	    ca_data: …
//	  - name: lab
//	    server: lab-head:7443
//	    …
//
// A config without contexts is one cluster, as before.
type configFile struct {
	ClientConfig   `yaml:",inline"`
	CurrentContext string         `yaml:"current_context,omitempty"`
	Contexts       []namedContext `yaml:"contexts,omitempty"`
}

type namedContext struct {
	Name         string `yaml:"name"`
	ClientConfig `yaml:",inline"`
}

// Context is one of a client config's clusters as a list shows it.
type Context struct {
	Name string
	// Server is the context's server addresses, comma-separated.
	Server string
}

// Contexts lists a client config's contexts in the file's order and the
// one in use: named by $GPUCTL_CONTEXT, else the file's current_context.
// A config without contexts has none.
func Contexts(path string) (list []Context, current string, err error) {
	f, err := readConfigFile(path)
	if err != nil {
		return nil, "", err
	}
	for _, c := range f.Contexts {
		servers := c.Servers
		if c.Server != "" {
			servers = append([]string{c.Server}, servers...)
		}
		list = append(list, Context{Name: c.Name, Server: strings.Join(servers, ",")})
	}
	current = f.CurrentContext
	if env := os.Getenv(EnvContext); env != "" {
		current = env
	}
	return list, current, nil
}

func readConfigFile(path string) (*configFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load client config: %w", err)
	}
	var f configFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, ioEOF) {
		return nil, fmt.Errorf("client config %s: parse YAML (want server or servers, ca, cert, key or their _data, or contexts with current_context): %w", path, err)
	}
	seen := map[string]bool{}
	for i, c := range f.Contexts {
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("client config %s: context %d has no name", path, i+1)
		case seen[c.Name]:
			return nil, fmt.Errorf("client config %s: context %q is listed twice", path, c.Name)
		}
		seen[c.Name] = true
	}
	if len(f.Contexts) > 0 && (f.Server != "" || len(f.Servers) > 0) {
		return nil, fmt.Errorf("client config %s: both a top-level server and contexts: move the server into a context", path)
	}
	return &f, nil
}

// selectContext returns the YAML of the client config to use from a
// file's text: the file itself without contexts, else the context named
// (want, else the file's current_context, else its only one).
func selectContext(path string, data []byte, want string) ([]byte, error) {
	f, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	if len(f.Contexts) == 0 {
		if want != "" {
			return nil, fmt.Errorf("client config %s has no contexts, so no context %q: list clusters under contexts: (gpuctl config add-context)", path, want)
		}
		return data, nil
	}
	if want == "" {
		want = f.CurrentContext
	}
	if want == "" && len(f.Contexts) == 1 {
		want = f.Contexts[0].Name
	}
	var names []string
	for _, c := range f.Contexts {
		names = append(names, c.Name)
		if c.Name == want {
			return yaml.Marshal(&c.ClientConfig)
		}
	}
	if want == "" {
		return nil, fmt.Errorf("client config %s has contexts (%s) but no current_context: pick one with gpuctl config use-context NAME or --context NAME", path, strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("client config %s has no context %q: it has %s", path, want, strings.Join(names, ", "))
}

// UseContext makes name the config's current context, keeping the rest
// of the file as it is.
func UseContext(path, name string) error {
	f, err := readConfigFile(path)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(f.Contexts, func(c namedContext) bool { return c.Name == name }) {
		var names []string
		for _, c := range f.Contexts {
			names = append(names, c.Name)
		}
		if len(names) == 0 {
			return fmt.Errorf("client config %s has no contexts: add one with gpuctl config add-context", path)
		}
		return fmt.Errorf("client config %s has no context %q: it has %s", path, name, strings.Join(names, ", "))
	}
	return editConfig(path, func(doc *yaml.Node) error {
		setKey(doc, "current_context", name)
		return nil
	})
}

// AddContext adds the client config at from to the config at path as
// context name (the config at path is created if missing, and a config
// without contexts becomes its context "default" first). Paths in from
// are kept absolute; a context's credentials may also be inline.
func AddContext(path, name, from string) error {
	if name == "" || strings.ContainsAny(name, " \t\n:/") {
		return fmt.Errorf("context name %q: use letters, digits, '-', '_' or '.'", name)
	}
	src, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("add context: %w", err)
	}
	ctxCfg, err := parseClientConfig(src, dirOf(from))
	if err != nil {
		return fmt.Errorf("add context from %s: %w", from, err)
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := writeFileNew(path, []byte("contexts: []\n"), 0o600); err != nil {
			return fmt.Errorf("add context: %w", err)
		}
	}
	f, err := readConfigFile(path)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(f.Contexts, func(c namedContext) bool { return c.Name == name }) {
		return fmt.Errorf("client config %s already has a context %q", path, name)
	}
	add := namedContext{Name: name, ClientConfig: *ctxCfg}
	add.Server, add.Servers = strings.Join(ctxCfg.Servers, ","), nil
	return editConfig(path, func(doc *yaml.Node) error {
		var list []namedContext
		if len(f.Contexts) == 0 && (f.Server != "" || len(f.Servers) > 0) {
			// The single cluster becomes a context of its own.
			old := f.ClientConfig
			list = append(list, namedContext{Name: "default", ClientConfig: old})
			for _, k := range []string{"server", "servers", "ca", "cert", "key", "ca_data", "cert_data", "key_data"} {
				deleteKey(doc, k)
			}
			setKey(doc, "current_context", "default")
		}
		list = append(list, f.Contexts...)
		list = append(list, add)
		var n yaml.Node
		if err := n.Encode(list); err != nil {
			return err
		}
		setNode(doc, "contexts", &n)
		if f.CurrentContext == "" && len(list) == 1 {
			setKey(doc, "current_context", name)
		}
		return nil
	})
}

var ioEOF = io.EOF

func dirOf(path string) string { return filepath.Dir(path) }

// editConfig rewrites the config at path through its YAML tree, so the
// keys and comments it does not touch stay as they were; the file keeps
// its mode and is replaced whole (a reader sees the old or the new).
func editConfig(path string, edit func(doc *yaml.Node) error) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("edit client config: %w", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("edit client config %s: %w", path, err)
	}
	if root.Kind == 0 {
		root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("edit client config %s: not a YAML mapping", path)
	}
	if err := edit(root.Content[0]); err != nil {
		return fmt.Errorf("edit client config %s: %w", path, err)
	}
	out, err := yaml.Marshal(&root)
	if err != nil {
		return fmt.Errorf("edit client config %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("edit client config %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("edit client config %s: %w", path, err)
	}
	return nil
}

func setKey(m *yaml.Node, key, value string) {
	setNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Value: value})
}

func setNode(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
}

func deleteKey(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}
