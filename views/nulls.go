package views

import (
	"encoding/json"
	"reflect"
	"strings"
)

// WithNulls returns v as JSON values in which every field of every struct
// is present: a field its type marks omitempty that is empty becomes null,
// so that documents built from types shared with other code (the cost
// model's) keep the one rule for absent values: present, and null.
func WithNulls(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	fill(reflect.ValueOf(v), out)
	return out, nil
}

// fill adds null for the omitempty fields of rv missing from j, the
// decoded JSON of rv.
func fill(rv reflect.Value, j any) {
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return
		}
		rv = rv.Elem()
	}
	switch rv.Kind() {
	case reflect.Struct:
		m, ok := j.(map[string]any)
		if !ok {
			return
		}
		fillStruct(rv, m)
	case reflect.Slice, reflect.Array:
		a, ok := j.([]any)
		if !ok {
			return
		}
		for i := 0; i < rv.Len() && i < len(a); i++ {
			fill(rv.Index(i), a[i])
		}
	case reflect.Map:
		m, ok := j.(map[string]any)
		if !ok {
			return
		}
		for _, k := range rv.MapKeys() {
			if k.Kind() == reflect.String {
				fill(rv.MapIndex(k), m[k.String()])
			}
		}
	}
}

func fillStruct(rv reflect.Value, m map[string]any) {
	t := rv.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			// Its fields are promoted, as encoding/json does.
			fill(rv.Field(i), m)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if val, ok := m[name]; ok {
			fill(rv.Field(i), val)
		} else if strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero") {
			m[name] = nil
		}
	}
}
