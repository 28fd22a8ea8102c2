// Package nvml is nodemon's GPU collector.
//
// Everything above the NVML boundary is written against go-nvml's
// nvml.Interface, so the same Sampler drives the real library (Open) and a
// simulated DGX host (NewSim) built on go-nvml's own mock servers. The
// simulated host's counters follow what really runs: the processes assigned
// to a GPU are measured from /proc, and their CPU time (or the kernel time
// they report in SimOptions.KernelDir, when larger), memory and I/O become
// that GPU's utilization, power, heat, memory use and link traffic.
package nvml
