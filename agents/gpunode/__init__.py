"""gpunode: GPU node agents for Kubernetes and bare metal."""

__version__ = "0.1.0"
