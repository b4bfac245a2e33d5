"""MIG: the mig-parted-compatible config format, an exact placement planner, `gpunode-mig` and the MIG
manager daemon."""
