"""Versioned file formats shared by the agents (and what they mean), nothing else.

The device plugin / feature discovery ``version: v1`` config (:mod:`.plugin_config`, its plain types in
:mod:`.plugin_types`), mig-parted's ``version: v1`` MIG config (:mod:`.mig_config`), hooks file
(:mod:`.mig_hooks`) and GPU-clients file (:mod:`.gpu_clients`), the ClusterPolicy model
(:mod:`.clusterpolicy`) and the readiness files under ``/run/nvidia/validations`` (:mod:`.readiness`).
Agents import formats from here, never from each other. This package knows no NVML beyond the MIG
profile grammar, no Kubernetes client and no agent; pydantic is imported only by the modules that
define models, so importing the plain types stays light.
"""
