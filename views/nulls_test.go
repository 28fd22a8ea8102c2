package views

import (
	"encoding/json"
	"testing"
)

func TestWithNulls(t *testing.T) {
	type inner struct {
		A int    `json:"a,omitempty"`
		B string `json:"b"`
	}
	type doc struct {
		Name  string           `json:"name,omitempty"`
		Items []inner          `json:"items"`
		One   *inner           `json:"one,omitempty"`
		ByKey map[string]inner `json:"by_key,omitempty"`
		Skip  int              `json:"-"`
		inner
	}
	v, err := WithNulls(doc{Items: []inner{{A: 1}, {}}, ByKey: map[string]inner{"k": {}}, Skip: 3})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	want := `{"a":null,"b":"","by_key":{"k":{"a":null,"b":""}},"items":[{"a":1,"b":""},{"a":null,"b":""}],"name":null,"one":null}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
}
