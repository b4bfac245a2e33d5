"""The MPS control daemon agent (gpunode-mps-control-daemon): NVIDIA's mps-control-daemon for sharing.mps."""
