package views

import (
	"bytes"
	"testing"

	"github.com/gpuctl/gpuctl/transport"
)

func TestContexts(t *testing.T) {
	var b bytes.Buffer
	if err := Contexts(&b, "config.yaml", nil, ""); err != nil {
		t.Fatal(err)
	}
	list := []transport.Context{{Name: "prod", Server: "gpu.example:7443"}, {Name: "lab-west", Server: "10.0.0.2:7443,10.0.0.3:7443"}}
	if err := Contexts(&b, "config.yaml", list, "lab-west"); err != nil {
		t.Fatal(err)
	}
	golden(t, b.Bytes())
}
