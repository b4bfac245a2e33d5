"""The registry's HTTP ports are the specs' (rendering reads them from the registry, so that it never
imports the agents' modules), and rendering indeed imports none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpunode import registry
from gpunode.deploy.render import MAIN_VERBS

POLICY = Path(__file__).resolve().parents[3] / "containers/policies/default.yaml"


def test_each_deployed_agents_port_is_its_specs() -> None:
    deployed = [e for e in registry.AGENTS if e.operand is not None]
    assert deployed
    for e in deployed:
        assert e.http_port == registry.spec(e.key, MAIN_VERBS.get(e.key, "")).default_http_port, e.key


def test_rendering_every_agent_imports_no_agent_module() -> None:
    """The operator renders in its own process: no grpc, protobuf or prometheus_client for that."""
    code = (
        "import sys\n"
        "from gpunode import registry\n"
        "from gpunode.api.clusterpolicy import load_policy\n"
        "from gpunode.deploy.render import render_by_agent\n"
        f"objs = render_by_agent(load_policy({str(POLICY)!r}).policy)\n"
        "assert len(objs) >= 7, objs.keys()\n"
        "loaded = [e.module for e in registry.AGENTS if e.module in sys.modules]\n"
        "heavy = [m for m in ('grpc', 'google.protobuf', 'prometheus_client') if m in sys.modules]\n"
        "print(loaded, heavy)\n"
        "sys.exit(1 if loaded or heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
