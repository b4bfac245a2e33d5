"""The Kubernetes layer every agent shares.

- :mod:`gpunode.kube.api`: what callers see (:class:`~gpunode.kube.api.NodeInfo`,
  :class:`~gpunode.kube.api.PodInfo`, the :class:`~gpunode.kube.api.KubeError` family), importable without
  the client library, so type hints and ``except`` clauses cost nothing at start-up;
- :mod:`gpunode.kube.client`: :class:`~gpunode.kube.client.Kube`, the only module that imports the
  client library (lightkube, httpx2); import it only where the API is used;
- :mod:`gpunode.kube.selectors`: the one label-selector parser;
- :mod:`gpunode.kube.operands`: pausing the GPU operands on a node, crash-safe;
- :mod:`gpunode.kube.drain`: kubectl drain's rules for the pods on a node.

Nothing here imports an agent, the simulated world or NVML.
"""
