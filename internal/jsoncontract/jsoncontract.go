// Package jsoncontract checks gpuctl's JSON documents against the
// README's "JSON output" section, so that the documentation and the code
// cannot drift: every field a document holds must be named there.
//
// The section has one "### " heading per document, naming in backticks
// the commands that print it (`jobs`, `cancel`); every name in backticks
// under a heading is documented for those commands, and "as in `gpuctl
// X`" takes in the names documented for X.
package jsoncontract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Contract is what the README documents, by command.
type Contract struct {
	names map[string]map[string]bool
	alias map[string][]string
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	ident      = regexp.MustCompile(`[a-z_][a-z0-9_]*`)
	asIn       = regexp.MustCompile("as in `gpuctl ([a-z]+)")
)

// dataMaps are fields whose keys are data (a node's labels, an event's
// attrs), not field names.
var dataMaps = map[string]bool{"labels": true, "attrs": true}

// Parse reads the "## JSON output" section of a README.
func Parse(readme []byte) (*Contract, error) {
	start := bytes.Index(readme, []byte("\n## JSON output\n"))
	if start < 0 {
		return nil, fmt.Errorf(`README has no "## JSON output" section`)
	}
	body := readme[start+1:]
	if end := bytes.Index(body[3:], []byte("\n## ")); end >= 0 {
		body = body[:end+3]
	}
	c := &Contract{names: map[string]map[string]bool{}, alias: map[string][]string{}}
	for _, sec := range strings.Split(string(body), "\n### ")[1:] {
		heading, text, _ := strings.Cut(sec, "\n")
		var cmds []string
		for _, m := range backticked.FindAllStringSubmatch(heading, -1) {
			if !strings.HasPrefix(m[1], "-") {
				// A flag (`--trace`) says which form of the command.
				cmds = append(cmds, m[1])
			}
		}
		if len(cmds) == 0 {
			return nil, fmt.Errorf("README: JSON output heading %q names no command in backticks", heading)
		}
		names := map[string]bool{}
		for _, m := range backticked.FindAllStringSubmatch(text, -1) {
			for _, id := range ident.FindAllString(m[1], -1) {
				names[id] = true
			}
		}
		var aliases []string
		for _, m := range asIn.FindAllStringSubmatch(text, -1) {
			aliases = append(aliases, m[1])
		}
		for _, cmd := range cmds {
			if c.names[cmd] == nil {
				c.names[cmd] = map[string]bool{}
			}
			for n := range names {
				c.names[cmd][n] = true
			}
			c.alias[cmd] = append(c.alias[cmd], aliases...)
		}
	}
	return c, nil
}

// Commands lists the commands the README documents.
func (c *Contract) Commands() []string {
	var out []string
	for cmd := range c.names {
		out = append(out, cmd)
	}
	sort.Strings(out)
	return out
}

func (c *Contract) documented(cmd string, seen map[string]bool) map[string]bool {
	out := map[string]bool{}
	if seen[cmd] {
		return out
	}
	seen[cmd] = true
	for n := range c.names[cmd] {
		out[n] = true
	}
	for _, a := range c.alias[cmd] {
		for n := range c.documented(a, seen) {
			out[n] = true
		}
	}
	return out
}

// Undocumented returns the field names in doc (one JSON value: a
// document, or one line of a stream) that the README does not document
// for cmd, each with the path where it was found.
func (c *Contract) Undocumented(cmd string, doc []byte) ([]string, error) {
	if c.names[cmd] == nil {
		return nil, fmt.Errorf("README documents no JSON output of gpuctl %s", cmd)
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("gpuctl %s printed invalid JSON: %w\n%s", cmd, err, doc)
	}
	known := c.documented(cmd, map[string]bool{})
	missing := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := strings.TrimPrefix(path+"."+k, ".")
				if !known[k] {
					missing[p] = true
				}
				if !dataMaps[k] {
					walk(p, x)
				}
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(missing))
	for p := range missing {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// Fields returns every field name in doc, with their paths, for checking
// that a test saw the fields it meant to.
func Fields(doc []byte) ([]string, error) {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := strings.TrimPrefix(path+"."+k, ".")
				seen[p] = true
				if !dataMaps[k] {
					walk(p, x)
				}
			}
		case []any:
			for _, x := range v {
				walk(path+"[]", x)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}
