"""The agent registry agrees with pyproject.toml's console scripts and with each agent's own specs."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from gpunode import registry

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
SCRIPTS: dict[str, str] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]
COMMANDS = {"gpunode"}  # console scripts that are commands, not agents


def test_every_console_script_is_an_agent_or_a_command() -> None:
    assert set(SCRIPTS) == {e.console_script for e in registry.AGENTS} | COMMANDS


@pytest.mark.parametrize("entry", registry.AGENTS, ids=lambda e: e.key)
def test_entry_matches_its_console_script_and_specs(entry: registry.AgentEntry) -> None:
    assert SCRIPTS[entry.console_script] == f"{entry.module}:main"
    module = importlib.import_module(entry.module)
    assert callable(module.main)
    assert hasattr(module, "SPEC") != hasattr(module, "SPECS"), "SPEC (one command) or SPECS (verbs)"
    specs = registry.specs(entry.key)
    assert specs
    for verb, spec in specs.items():
        assert spec.console_script == entry.console_script
        assert spec.prog == f"{entry.console_script} {verb}".strip()
        assert spec.prog.startswith(entry.console_script)


def test_unknown_keys_and_verbs_name_the_choices() -> None:
    with pytest.raises(KeyError, match="toolkit"):
        registry.entry("nope")
    with pytest.raises(KeyError, match="cdi generate"):
        registry.spec("toolkit", "nope")
