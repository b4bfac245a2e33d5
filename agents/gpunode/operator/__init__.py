"""gpunode-operator: the cluster-side controllers (issue 15).

- :mod:`gpunode.operator.labels`: which labels a node should carry, pure (NFD's GPU labels in,
  ``nvidia.com/gpu.present`` and the ``nvidia.com/gpu.deploy.<operand>`` labels out);
- :mod:`gpunode.operator.labeller`: the node-labelling controller: watch every node, plan, merge-patch;
- :mod:`gpunode.operator.upgrade_plan` and :mod:`gpunode.operator.upgrade`: the rolling driver upgrade
  (issue 17): its decisions, pure, and the controller that applies them (docs/upgrades.md).

Imported as ``gpunode.operator`` (absolute imports only: the name shadows the standard library's
``operator`` nowhere else). Nothing here imports an agent, the simulated world or NVML; the Kubernetes
client only where a controller is started.
"""
