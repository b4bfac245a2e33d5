"""GPU feature discovery: NVIDIA GFD's ``nvidia.com/*`` node labels, computed from NVML and sysfs facts.

* :mod:`.facts` gathers what the labels are computed from (NVML inventory, MIG devices, PCI classes,
  the DMI machine name, vGPU presence) into one frozen :class:`~.labels.NodeFacts`.
* :mod:`.labels` is pure: facts + MIG strategy + sharing settings -> the label set, with warnings and a
  record of every value it had to change to make it a valid Kubernetes label value.
* :mod:`.output` writes the labels (NFD feature file or NodeFeature object); :mod:`.labeler` is one
  pass (facts, labels, output; each warning once); :mod:`.loop` decides when passes run (interval, MIG
  and XID events, SIGHUP, the config a node label chooses) and wires the service.
* :mod:`.settings` declares the flags, env vars and config-file keys; :mod:`.config` reads what the
  ``version: v1`` file changes (MIG strategy, time-slicing) again; :mod:`.cli` is the
  ``gpunode-feature-discovery`` entry point.
"""
