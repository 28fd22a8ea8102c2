package jobspec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a job: the field's path (plan.tp,
// env.FOO, elastic.data_parallel[1]), its line in the file when known, and why.
type Problem struct {
	Path   string `json:"path"`
	Line   int    `json:"line,omitempty"`
	Reason string `json:"reason"`
}

// ValidationError lists every problem found in one job.
type ValidationError struct {
	// Source names the job file, or is empty for command-line flags.
	Source   string    `json:"source,omitempty"`
	Problems []Problem `json:"problems"`
}

// Error renders one problem per line: "job.yaml:12: plan.tp: reason".
func (e *ValidationError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		switch {
		case e.Source != "" && p.Line > 0:
			fmt.Fprintf(&b, "%s:%d: ", e.Source, p.Line)
		case e.Source != "":
			fmt.Fprintf(&b, "%s: ", e.Source)
		}
		if p.Path != "" {
			b.WriteString(p.Path)
			b.WriteString(": ")
		}
		b.WriteString(p.Reason)
	}
	return b.String()
}

// maxSpecBytes bounds a job file; a real one is a few hundred bytes.
const maxSpecBytes = 1 << 20

// ParseFile reads and parses a job file.
func ParseFile(path string) (*Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open job file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read job file %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes a YAML job, refusing unknown fields, fills defaults and
// validates it. source names the file in messages. A job with problems
// returns a *ValidationError listing all of them.
func Parse(source string, data []byte) (*Spec, error) {
	if len(data) > maxSpecBytes {
		return nil, &ValidationError{Source: source, Problems: []Problem{{Reason: fmt.Sprintf("job file is over %d bytes; a job file describes one job", maxSpecBytes)}}}
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &ValidationError{Source: source, Problems: []Problem{{Reason: "empty job file: give at least name, command and gpus"}}}
		}
		return nil, &ValidationError{Source: source, Problems: []Problem{yamlProblem(err.Error(), nil)}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &ValidationError{Source: source, Problems: []Problem{{Line: extra.Line, Reason: "more than one YAML document: submit one job per file"}}}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if doc.Kind != yaml.MappingNode {
		return nil, &ValidationError{Source: source, Problems: []Problem{{Line: doc.Line, Reason: "a job file is a mapping of fields (name: …, command: …, gpus: …)"}}}
	}

	budget := maxExpandedNodes
	doc, err := expandAliases(doc, nil, &budget)
	if err != nil {
		return nil, &ValidationError{Source: source, Problems: []Problem{{Line: err.(aliasError).line, Reason: err.Error()}}}
	}

	lines := map[string]int{}
	var probs []Problem
	checkFields(doc, reflect.TypeOf(Spec{}), "", lines, &probs)
	if len(probs) > 0 {
		return nil, &ValidationError{Source: source, Problems: probs}
	}

	// Decoded from the expanded tree, so a value that came through an
	// alias is reported at the alias; checkFields has refused unknown
	// fields already.
	var s Spec
	if err := doc.Decode(&s); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, msg := range te.Errors {
				probs = append(probs, yamlProblem(msg, lines))
			}
		} else {
			probs = append(probs, yamlProblem(err.Error(), lines))
		}
		return nil, &ValidationError{Source: source, Problems: probs}
	}
	s.ApplyDefaults()
	if err := s.validate(lines); err != nil {
		err.Source = source
		return nil, err
	}
	return &s, nil
}

// maxExpandedNodes bounds a job file's tree once its aliases are
// expanded: a real job has a few dozen nodes, a YAML bomb (aliases of
// aliases of lists) billions.
const maxExpandedNodes = 10_000

// aliasError is a file whose aliases expand past maxExpandedNodes.
type aliasError struct{ line int }

func (e aliasError) Error() string {
	return fmt.Sprintf("its aliases expand to more than %d values; a job file is a few dozen: write the values out", maxExpandedNodes)
}

// expandAliases returns a copy of n with every alias replaced by a copy of
// the value it names, and that copy placed at the alias's line and
// column: a problem in an aliased value is reported where it is used, not
// at the anchor. budget bounds the nodes made.
func expandAliases(n, at *yaml.Node, budget *int) (*yaml.Node, error) {
	if *budget--; *budget < 0 {
		line := n.Line
		if at != nil {
			line = at.Line
		}
		return nil, aliasError{line: line}
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		if at == nil {
			at = n
		}
		return expandAliases(n.Alias, at, budget)
	}
	c := *n
	c.Anchor = ""
	if at != nil {
		c.Line, c.Column = at.Line, at.Column
	}
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, child := range n.Content {
		var err error
		if c.Content[i], err = expandAliases(child, at, budget); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlProblem turns a yaml.v3 message ("line 4: cannot unmarshal …") into
// a Problem, naming the field on that line when it is known.
func yamlProblem(msg string, lines map[string]int) Problem {
	m := yamlLineRE.FindStringSubmatch(msg)
	if m == nil {
		return Problem{Reason: strings.TrimPrefix(msg, "yaml: ")}
	}
	line, _ := strconv.Atoi(m[1])
	p := Problem{Line: line, Reason: m[2]}
	// The deepest path on that line is the field the value belongs to.
	for path, l := range lines {
		if l == line && len(path) > len(p.Path) {
			p.Path = path
		}
	}
	return p
}

// checkFields walks the YAML tree against the Go type, records each
// field's line under its dotted path, and reports unknown fields with the
// known ones (and a near match) so a typo is easy to fix.
func checkFields(n *yaml.Node, t reflect.Type, path string, lines map[string]int, probs *[]Problem) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct && t.PkgPath() != "time" && n.Kind == yaml.MappingNode:
		fields := map[string]reflect.Type{}
		var names []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = f.Type
			names = append(names, name)
		}
		sort.Strings(names)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				reason := "unknown field; known fields are " + strings.Join(names, ", ")
				if near := closest(k.Value, names); near != "" {
					reason = fmt.Sprintf("unknown field (did you mean %s?); known fields are %s", near, strings.Join(names, ", "))
				}
				*probs = append(*probs, Problem{Path: p, Line: k.Line, Reason: reason})
				continue
			}
			lines[p] = k.Line
			checkFields(v, ft, p, lines, probs)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			lines[p] = k.Line
			checkFields(v, t.Elem(), p, lines, probs)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, v := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			lines[p] = v.Line
			checkFields(v, t.Elem(), p, lines, probs)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// closest returns the known name within edit distance 2 of s, if any.
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
