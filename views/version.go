package views

import (
	"fmt"
	"io"

	"github.com/gpuctl/gpuctl/api"
)

// VersionJSON is one component in `gpuctl version -o json`: the client,
// or the server it is configured for (with the error that kept its
// version unknown, when one did).
type VersionJSON struct {
	Component string  `json:"component"`
	Version   *string `json:"version"`
	Commit    *string `json:"commit"`
	Protocol  *string `json:"protocol"`
	GoVersion *string `json:"go_version"`
	Address   *string `json:"address"`
	Error     *string `json:"error"`
}

// Versions writes the versions of the client and the server. In table mode
// a server whose version is unknown is said on stderr.
func Versions(w io.Writer, o Options, vs []VersionJSON) error {
	if o.Format == JSON {
		return writeJSON(w, struct {
			Versions []VersionJSON `json:"versions"`
		}{orEmpty(vs)})
	}
	for _, v := range vs {
		if v.Error != nil {
			if o.Stderr != nil {
				fmt.Fprintf(o.Stderr, "%s %s: version unknown: %s\n", v.Component, dash(deref(v.Address)), api.EscapeText(*v.Error))
			}
			continue
		}
		line := fmt.Sprintf("%s %s, protocol v%s", v.Component, dash(deref(v.Version)), dash(deref(v.Protocol)))
		if v.Commit != nil {
			line += ", commit " + *v.Commit
		}
		if v.GoVersion != nil {
			line += ", " + *v.GoVersion
		}
		if v.Address != nil {
			line += " at " + *v.Address
		}
		if _, err := fmt.Fprintln(w, api.EscapeText(line)); err != nil {
			return err
		}
	}
	return nil
}
