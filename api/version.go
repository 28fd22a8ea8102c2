package api

import "fmt"

// Protocol version spoken by this build. A peer with another major version
// is refused; minor versions only add fields. v1.3 added the features of
// Hello and Welcome (features.go).
const (
	ProtocolMajor = 1
	ProtocolMinor = 3
)

// CurrentVersion is the version this build sends in Hello.
func CurrentVersion() *Version {
	return &Version{Major: ProtocolMajor, Minor: ProtocolMinor}
}

// CheckVersion returns an error that says what to do when v is not a
// version this build can talk to.
func CheckVersion(v *Version) error {
	if v == nil {
		return fmt.Errorf("peer sent no protocol version: it is older than gpuctl protocol v%d; upgrade it", ProtocolMajor)
	}
	if v.GetMajor() != ProtocolMajor {
		return fmt.Errorf("peer speaks gpuctl protocol v%d.%d, this side speaks v%d.%d: run the same major release of gpuctl and nodemon on both sides",
			v.GetMajor(), v.GetMinor(), ProtocolMajor, ProtocolMinor)
	}
	return nil
}

// Release is the gpuctl release every program of this build reports
// (nodemon, gpuctl serve, gpuctl).
const Release = "0.1.0"
