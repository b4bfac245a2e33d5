"""The operator's controller core (states, readiness, status, selection, queue, leader election, the
ClusterPolicy controller, the wiring and the spec) loads without the Kubernetes client, pydantic, YAML,
NVML, rendering or the simulated world: they are imported only where used."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_operator_core_imports_light() -> None:
    code = textwrap.dedent(
        """
        import sys
        import gpunode.operator.states, gpunode.operator.readiness, gpunode.operator.status
        import gpunode.operator.selection, gpunode.operator.queue, gpunode.operator.leader
        import gpunode.operator.controller, gpunode.operator.app, gpunode.operator.cli
        heavy = ("lightkube", "httpx2", "pydantic", "yaml", "pynvml")
        loaded = sorted(
            m for m in sys.modules
            if m.split(".")[0] in heavy or m.startswith(("gpunode.nvml", "gpunode.deploy", "gpunode.sim"))
        )
        print(",".join(loaded) or "none")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
