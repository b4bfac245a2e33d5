"""gpunode-exporter: dcgm-exporter's metrics, names and labels, sampled through NVML."""
