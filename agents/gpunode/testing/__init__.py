"""Test doubles that speak the real protocols: a fake kubelet (gRPC over Unix sockets)."""
