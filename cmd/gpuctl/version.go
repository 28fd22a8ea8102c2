package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newVersionCmd) }

// buildCommit is the VCS revision go build stamped into this binary, ""
// when none.
func buildCommit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

func newVersionCmd() *cobra.Command {
	var config, output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this client's version and, when it is reachable, the server's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := views.ParseFormat(output)
			if err != nil || f == views.Wide {
				return fmt.Errorf("unknown output %q: use table or json", output)
			}
			proto := fmt.Sprintf("%d.%d", api.ProtocolMajor, api.ProtocolMinor)
			vs := []views.VersionJSON{{Component: "client", Version: ptrTo(agent.Version), Commit: optStr(buildCommit()),
				Protocol: ptrTo(proto), GoVersion: ptrTo(runtime.Version())}}
			vs = append(vs, serverVersion(cmd.Context(), config))
			return views.Versions(cmd.OutOrStdout(), views.Options{Format: f, Stderr: cmd.ErrOrStderr()}, vs)
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// serverVersion asks the server named by the client config; what went
// wrong (no config, not reachable, a server too old to say) is in Error.
func serverVersion(ctx context.Context, config string) views.VersionJSON {
	v := views.VersionJSON{Component: "server"}
	path, err := client.ConfigPath(config)
	if err == nil {
		var cfg *transport.ClientConfig
		if cfg, _, err = transport.LoadClientConfig(path); err == nil {
			v.Address = optStr(cfg.Server)
		}
	}
	if err != nil {
		v.Error = ptrTo(err.Error())
		return v
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, path)
	if err != nil {
		v.Error = ptrTo(err.Error())
		return v
	}
	defer c.Close()
	r, err := c.Version(ctx)
	if err != nil {
		v.Error = ptrTo("reachable, but it did not say its version: " + err.Error())
		return v
	}
	v.Version, v.Commit = optStr(r.GetSoftware()), optStr(r.GetCommit())
	if p := r.GetProtocol(); p != nil {
		v.Protocol = ptrTo(fmt.Sprintf("%d.%d", p.GetMajor(), p.GetMinor()))
	}
	return v
}

func ptrTo[T any](v T) *T { return &v }

func optStr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
