package nvml

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoNVML reports that libnvidia-ml.so.1 could not be loaded: the host has
// no NVIDIA driver. Callers fall back to a simulated host (NewSim).
var ErrNoNVML = errors.New("NVML is not available (libnvidia-ml.so.1 not found: no NVIDIA driver on this host)")

// Open loads and initialises the real NVML library. Without a driver the
// error wraps both ErrNoNVML and nvml.ERROR_LIBRARY_NOT_FOUND. The caller
// owns the library and ends it with Shutdown.
func Open() (nvml.Interface, error) {
	lib := nvml.New()
	ret := lib.Init()
	switch ret {
	case nvml.SUCCESS:
		return lib, nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("open NVML: %w (%w)", ErrNoNVML, ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("open NVML: %w (%w); load the nvidia kernel module (modprobe nvidia)", ErrNoNVML, ret)
	default:
		return nil, fmt.Errorf("open NVML: init: %w", ret)
	}
}

// isLost reports whether an NVML return means the GPU no longer answers.
func isLost(ret nvml.Return) bool {
	return ret == nvml.ERROR_GPU_IS_LOST
}

// unsupported reports whether an NVML return means this GPU or driver does
// not offer the value; such values are left zero.
func unsupported(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_NOT_FOUND,
		nvml.ERROR_NO_PERMISSION, nvml.ERROR_INVALID_ARGUMENT:
		return true
	}
	return false
}
