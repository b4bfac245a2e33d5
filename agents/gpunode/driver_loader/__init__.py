"""The driver loader: kernel modules, nouveau, device nodes, persistence, readiness, and safe upgrades."""
