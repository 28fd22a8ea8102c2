package views

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gpuctl/gpuctl/transport"
)

// Contexts writes `gpuctl config get-contexts`: the contexts of the client
// config at path, the current one marked *.
func Contexts(w io.Writer, path string, list []transport.Context, current string) error {
	if len(list) == 0 {
		_, err := fmt.Fprintf(w, "%s has no contexts: it is one cluster (add others with gpuctl config add-context NAME --from FILE)\n", path)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CURRENT\tNAME\tSERVER")
	for _, c := range list {
		mark := ""
		if c.Name == current {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", mark, c.Name, c.Server)
	}
	return tw.Flush()
}
