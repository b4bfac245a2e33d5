"""Readiness validation (gpunode-validator) and the node doctor (gpunode doctor)."""
