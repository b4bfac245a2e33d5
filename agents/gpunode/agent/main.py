"""The one agent skeleton: what every ``gpunode-*`` entry point does the same way.

An agent declares an :class:`AgentSpec` (its name, console script, settings class and a ``start``
function) and its ``cli.main`` is ``SPEC.main``. :func:`agent_main` then:

1. snapshots the environment and resolves the typed settings (flag > env > file > default; usage and
   config-file errors print ``prog: error: ...`` and exit 2);
2. configures logging with the ``agent`` and ``node`` fields bound once;
3. checks the simulator arguments (an unknown preset or a foreign state file is exit 2);
4. calls the agent's ``start(ctx)``, which validates what only the agent knows and returns what to run
   (any of ``spec.usage_errors`` raised there prints ``prog: error: ...`` and exits 2);
5. logs the effective configuration once (the ``effective_config`` event, secrets redacted);
6. runs the returned coroutine under :func:`gpunode.common.runtime.run` (signals, grace period, exit
   codes through :func:`~gpunode.common.runtime.exit_code_for`).

NVML is opened by the agent when its tasks start, through :meth:`AgentContext.open_nvml` (the
simulator is installed beneath pynvml first when ``--simulate``/``--sim-state`` ask for it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gpunode.common.errors import ConfigError, UsageError
from gpunode.common.runtime import Main, run
from gpunode.common.settings import CommonSettings, Parsed, SettingsParser, flags_of

if TYPE_CHECKING:
    from pydantic import BaseModel

    from gpunode.common.cli import FlagSet
    from gpunode.nvml import Nvml

__all__ = [
    "USAGE_ERRORS",
    "AgentContext",
    "AgentSettings",
    "AgentSpec",
    "Started",
    "agent_main",
    "verbs_main",
]


class AgentSettings(Protocol):
    """What the skeleton needs of an agent's settings: the common group."""

    @property
    def common(self) -> CommonSettings: ...


S = TypeVar("S", bound=AgentSettings)

USAGE_ERRORS: tuple[type[Exception], ...] = (ValueError, LookupError, ConfigError, UsageError)


@dataclass(frozen=True)
class Started:
    """What an agent's ``start`` hands back: the coroutine (or factory) to run, and extra fields for
    the ``effective_config`` event."""

    main: Main
    log_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentContext(Generic[S]):
    """Everything ``start`` gets: the resolved command line, the environment snapshot, the parser (to
    resolve settings again on a config reload) and the spec."""

    parsed: Parsed[S]
    environ: Mapping[str, str]
    parser: SettingsParser[S]
    spec: AgentSpec[S]

    @property
    def settings(self) -> S:
        return self.parsed.settings

    async def open_nvml(self, driver_root: str | None = None) -> Nvml:
        """NVML for this agent: the simulated node when the settings ask for it, else the driver's
        library (from ``driver_root``, default ``--driver-root``)."""
        from gpunode.agent.nvml import open_nvml

        common = self.settings.common
        return await open_nvml(driver_root or common.driver_root, common.simulate, common.sim_state)


@dataclass(frozen=True)
class AgentSpec(Generic[S]):
    """One agent, declared once (the registry lists them all; ``cli.main`` is ``SPEC.main``).

    ``config_model`` loads the pydantic model of ``--config-file`` lazily (pydantic only when a file
    is given); ``wants_config(settings)`` may decline it (a directory of configs is read later).
    ``aliases`` are extra option strings per field; ``configure`` adds positionals.
    ``verb`` names the verb of a ``console_script VERB`` command (the parser's prog is both; errors
    keep ``console_script: error:``; ``errors_with_verb=True`` makes them ``console_script VERB:
    error:``, as gpunode-toolkit's are). ``uses_nvml=False`` says the agent never opens NVML, so the
    simulator flags are accepted but not checked. ``settings_for(argv, environ)`` picks the settings
    class (a subclass of ``settings_type``) before parsing, for flags whose defaults depend on
    another flag (gpunode-toolkit runtime's ``--runtime``); usage errors it raises exit 2.
    ``http_port`` names the port of an agent whose HTTP port is not an ``--http-port`` setting (the
    exporter's ``--address``); the others' comes from their settings (:attr:`default_http_port`).
    """

    name: str
    console_script: str
    settings_type: type[S]
    start: Callable[[AgentContext[S]], Started | int]
    description: str | None = None
    http_port: int | None = None
    config_model: Callable[[], type[BaseModel]] | None = None
    wants_config: Callable[[S], bool] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    configure: Callable[[FlagSet], None] | None = None
    usage_errors: tuple[type[Exception], ...] = USAGE_ERRORS
    verb: str = ""
    uses_nvml: bool = True
    errors_with_verb: bool = False
    settings_for: Callable[[Sequence[str], Mapping[str, str]], type[S]] | None = None

    @property
    def default_http_port(self) -> int | None:
        """The port of /healthz, /readyz and /metrics by default: ``http_port``, else the default of the
        settings' ``--http-port``; None for a command that serves no HTTP."""
        if self.http_port is not None:
            return self.http_port
        for flag in flags_of(self.settings_type):
            if flag.dest == "http_port":
                return int(flag.default)
        return None

    @property
    def prog(self) -> str:
        """The command as usage and argparse errors show it: ``console_script [verb]``."""
        return f"{self.console_script} {self.verb}" if self.verb else self.console_script

    @property
    def error_prefix(self) -> str:
        """What usage errors start with: ``console_script`` (or ``prog`` with ``errors_with_verb``)."""
        return self.prog if self.errors_with_verb else self.console_script

    def parser(self, settings_type: type[S] | None = None) -> SettingsParser[S]:
        return SettingsParser(
            settings_type or self.settings_type,
            prog=self.prog,
            description=self.description,
            aliases=self.aliases,
            configure=self.configure,
        )

    def main(self, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
        return agent_main(self, argv, environ)


def agent_main(
    spec: AgentSpec[S], argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """Parse, configure logging, check, start and run one agent; returns the exit code."""
    from gpunode.common.logging import configure_logging

    env = dict(os.environ if environ is None else environ)
    settings_type: type[S] | None = None
    if spec.settings_for is not None:
        try:
            settings_type = spec.settings_for(list(sys.argv[1:] if argv is None else argv), env)
        except spec.usage_errors as exc:
            print(f"{spec.error_prefix}: error: {exc}", file=sys.stderr)
            return 2
    parser = spec.parser(settings_type)
    parsed = parser.parse(argv, env)
    wanted = spec.wants_config is None or spec.wants_config(parsed.settings)
    if spec.config_model is not None and _config_path(parsed.settings) is not None and wanted:
        parsed = parser.parse(argv, env, spec.config_model())
    common = parsed.settings.common
    configure_logging(common.log_format, common.log_level, agent=spec.name, node=common.node_name)
    ctx = AgentContext(parsed=parsed, environ=env, parser=parser, spec=spec)
    try:
        if spec.uses_nvml:
            from gpunode.agent.nvml import check_simulation

            check_simulation(common.simulate, common.sim_state)
        started = spec.start(ctx)
    except spec.usage_errors as exc:
        print(f"{spec.error_prefix}: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(started, int):
        return started
    parsed.log_effective_config(**started.log_fields)
    return run(started.main)


def _config_path(settings: object) -> str | None:
    common = getattr(settings, "common", None)
    path = getattr(common, "config_file", None)
    return path if isinstance(path, str) and path else None


def verbs_main(
    prog: str,
    specs: Mapping[str, AgentSpec[Any]],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    usage: str | None = None,
) -> int:
    """``prog VERB [flags]``: the verb's spec runs through :func:`agent_main` with the rest of the line;
    no verb or ``-h`` prints ``usage`` (exit 2 / 0), an unknown verb names the verbs (exit 2)."""
    from gpunode.common.cli import split_verb

    split = split_verb(prog, argv, tuple(specs), usage)
    if isinstance(split, int):
        return split
    verb, rest = split
    return agent_main(specs[verb], rest, environ)
