"""Deployment: a ClusterPolicy (``policy``) rendered to Kubernetes manifests (``render``, ``render_cli``)."""
