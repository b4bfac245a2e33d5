"""The labelling rules and controller load without the Kubernetes client library, pydantic or NVML."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_labels_and_labeller_import_light() -> None:
    code = textwrap.dedent(
        """
        import sys
        import gpunode.operator.labels, gpunode.operator.labeller
        heavy = ("lightkube", "httpx2", "pydantic", "yaml", "pynvml")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith("gpunode.nvml"))
        print(",".join(loaded) or "none")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
