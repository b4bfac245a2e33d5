"""The simulated world: everything gpunode runs against instead of a real node and cluster.

- :mod:`gpunode.sim.nvml`: a faithful simulated libnvidia-ml beneath the real pynvml bindings
  (``gpunode sim ...`` drives it from outside)
- :mod:`gpunode.sim.kubelet`: the kubelet emulator (device plugin registration, ListAndWatch, Allocate)
- :mod:`gpunode.sim.podresources`: a fake kubelet pod-resources service
- :mod:`gpunode.sim.apiserver`: the test Kubernetes API server
- :mod:`gpunode.sim.host`: a fake host tree with fake kmod and NVIDIA tools, for the driver loader
- :mod:`gpunode.sim.mig_reset`: the GPU resetter for the simulated node

Agents import this package only lazily, when told to simulate; it never imports an agent.
"""
