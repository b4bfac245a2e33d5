"""Generated gRPC and protobuf code for the kubelet APIs; never hand-edited.

Regenerate with `python protos/generate.py` (sources in protos/); a test compares this folder
with a fresh run.
"""
