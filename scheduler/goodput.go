package scheduler

import "math"

// PriorGPUMTBFSeconds is the per-GPU mean time between job-interrupting
// failures assumed before a cluster has seen any: 419 unexpected
// interruptions in 54 days on 16,384 H100s (Llama 3 pre-training, Dubey
// et al. 2024), about 50,700 GPU-hours.
const PriorGPUMTBFSeconds = 50_700 * 3600

// GPUMTBF estimates the per-GPU MTBF in seconds from the failures a
// cluster has seen over the GPU-seconds its jobs ran, counting the prior
// as one pseudo-failure of evidence so that the estimate starts there and
// moves to the cluster's own rate as failures accumulate.
func GPUMTBF(failures int, gpuSeconds float64) float64 {
	return (PriorGPUMTBFSeconds + max(gpuSeconds, 0)) / float64(1+max(failures, 0))
}

// YoungDaly is the checkpoint interval sqrt(2·C·MTBF) that minimises the
// expected lost work for a checkpoint cost C and a mean time between
// failures (Young 1974; Daly 2006), 0 when either is unknown.
func YoungDaly(ckptSeconds, mtbfSeconds float64) float64 {
	if ckptSeconds <= 0 || mtbfSeconds <= 0 {
		return 0
	}
	return math.Sqrt(2 * ckptSeconds * mtbfSeconds)
}
