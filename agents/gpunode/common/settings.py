"""Typed settings, declared once: each field of a frozen dataclass carries its flag, env vars, file key
and default; one pure :func:`resolve` turns command line, environment and config file into an instance.

Precedence for every field: command-line flag > environment variable > config file > default (the
engine is :mod:`gpunode.common.cli`, which also builds the argparse parser). A settings class::

    @dataclass(frozen=True)
    class ExporterSettings:
        common: CommonSettings = group(CommonSettings)
        address: str = setting("--address", short="-a", env="DCGM_EXPORTER_LISTEN", default=":9400",
                               help="where /metrics is served")

Fields are either a :func:`setting` (one flag) or a :func:`group` (a nested settings dataclass whose
flags are declared in place, in field order). Every flag's ``dest`` is its field name, unique across
the whole class, so the effective-config log event and the sources keep one flat key per flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from gpunode.common.cli import (
    LOG_FORMATS,
    LOG_LEVEL_CHOICES,
    Flag,
    FlagSet,
    Source,
    log_effective_config,
    parse_log_level,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "CommonSettings",
    "HttpSettings",
    "KubeSettings",
    "Parsed",
    "SettingsParser",
    "flags_of",
    "group",
    "listen_address",
    "resolve",
    "setting",
]

S = TypeVar("S")

_FLAG = "gpunode.flag"
_GROUP = "gpunode.group"
_GROUP_ALIASES = "gpunode.group.aliases"
_GROUP_CLASS = "gpunode.group.class"
_GROUP_DEFAULTS = "gpunode.group.defaults"
_GROUP_METAVARS = "gpunode.group.metavars"


@dataclass(frozen=True)
class _Decl:
    """What :func:`setting` records on a field; the field's name becomes the flag's dest."""

    option: str
    envs: tuple[str, ...]
    type: Callable[[str], Any]
    choices: tuple[Any, ...] | None
    help: str
    metavar: str | None
    file_key: str | None
    secret: bool
    short: str | None
    aliases: tuple[str, ...]
    required: bool
    negatable: bool
    repeatable: bool
    default_help: str | None


def setting(
    option: str,
    *,
    default: Any = None,
    env: str | Sequence[str] | None = None,
    type: Callable[[str], Any] = str,
    choices: Sequence[Any] | None = None,
    help: str = "",
    metavar: str | None = None,
    file_key: str | None = None,
    secret: bool = False,
    short: str | None = None,
    aliases: Sequence[str] = (),
    required: bool = False,
    negatable: bool = True,
    repeatable: bool = False,
    default_help: str | None = None,
) -> Any:
    """A field that is one flag (``--long-name``), with env vars and an optional config-file key.

    ``type=bool`` makes a ``--x/--no-x`` switch (``--x=false`` works too); with ``negatable=False``
    it is a plain ``--x``. ``aliases`` are further option strings for the same value (NVIDIA's
    spellings), listed in the help as aliases. ``required`` flags must be given on the command line.
    A ``repeatable`` flag is given once per value (a tuple, default ``()``); its env vars hold a
    comma-separated list. ``default_help`` replaces the default shown in ``--help`` ("" hides it).
    """
    if not option.startswith("--"):
        raise ValueError(f"flag must start with '--': {option!r}")
    decl = _Decl(
        option=option,
        envs=(env,) if isinstance(env, str) else tuple(env or ()),
        type=type,
        choices=tuple(choices) if choices is not None else None,
        help=help,
        metavar=metavar,
        file_key=file_key,
        secret=secret,
        short=short,
        aliases=tuple(aliases),
        required=required,
        negatable=negatable,
        repeatable=repeatable,
        default_help=default_help,
    )
    if repeatable and default is None:
        default = ()
    return dataclasses.field(default=default, metadata={_FLAG: decl})


def group(
    cls: type[Any],
    *,
    help: Mapping[str, str] | None = None,
    aliases: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> Any:
    """A nested settings dataclass whose flags are declared here; ``help`` overrides texts by field.

    ``aliases`` maps further option strings to field names of the group; they are listed after the
    group's flags (where a command has always shown an alias such as ``--nvidia-cdi-hook-path``).
    ``defaults`` and ``metavars`` override the group's defaults and metavars by field, for this use
    only (each agent's own ``--http-port``, say).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    for what, overrides in (("help", help), ("defaults", defaults), ("metavars", metavars)):
        unknown = sorted(set(overrides or {}) - names)
        if unknown:
            raise TypeError(f"group({cls.__name__}): {what} for unknown fields {unknown}")
    meta = {
        _GROUP: dict(help or {}),
        _GROUP_ALIASES: dict(aliases or {}),
        _GROUP_CLASS: cls,
        _GROUP_DEFAULTS: dict(defaults or {}),
        _GROUP_METAVARS: dict(metavars or {}),
    }
    overrides = dict(defaults or {})

    def factory() -> Any:
        return cls(**overrides)

    return dataclasses.field(default_factory=factory, metadata=meta)


@dataclass(frozen=True)
class _Entry:
    path: tuple[str, ...]  # field names from the root to this flag
    flag: Flag
    short: str | None
    metavar: str | None
    aliases: tuple[str, ...]
    then: tuple[tuple[str, str], ...] = ()  # (option, dest) aliases declared after this flag


def _entries(
    cls: type[Any],
    path: tuple[str, ...] = (),
    help: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    metavars: Mapping[str, str] | None = None,
) -> Iterator[_Entry]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a settings dataclass")
    for f in dataclasses.fields(cls):
        if _GROUP in f.metadata:
            meta = f.metadata
            inner = list(
                _entries(
                    meta[_GROUP_CLASS],
                    (*path, f.name),
                    meta[_GROUP],
                    meta[_GROUP_DEFAULTS],
                    meta[_GROUP_METAVARS],
                )
            )
            then = tuple(meta.get(_GROUP_ALIASES, {}).items())
            if inner and then:
                inner[-1] = dataclasses.replace(inner[-1], then=inner[-1].then + then)
            yield from inner
            continue
        decl: _Decl | None = f.metadata.get(_FLAG)
        if decl is None:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it with setting() or group()")
        text = (help or {}).get(f.name, decl.help)
        flag = Flag(
            option=decl.option,
            dest=f.name,
            envs=decl.envs,
            type=decl.type,
            default=(defaults or {}).get(f.name, f.default),
            choices=decl.choices,
            is_bool=decl.type is bool,
            help=text,
            file_key=decl.file_key,
            secret=decl.secret,
            required=decl.required,
            negatable=decl.negatable,
            repeatable=decl.repeatable,
            default_help=decl.default_help,
        )
        metavar = (metavars or {}).get(f.name, decl.metavar)
        yield _Entry((*path, f.name), flag, decl.short, metavar, decl.aliases)


def flags_of(cls: type[Any]) -> list[Flag]:
    """Every flag a settings class declares, in declaration order (groups flattened)."""
    return [entry.flag for entry in _entries(cls)]


def _build(cls: type[S], values: Mapping[str, Any], path: tuple[str, ...] = ()) -> S:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if _GROUP in f.metadata:
            kwargs[f.name] = _build(f.metadata[_GROUP_CLASS], values, (*path, f.name))
        else:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def resolve(
    cls: type[S],
    argv_values: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, Any] | None = None,
) -> tuple[S, dict[str, Source]]:
    """The settings instance and each flag's source: flag > env var > config file > default.

    Pure, as :func:`gpunode.common.cli.resolve` (which it applies to the class's flags):
    ``argv_values`` holds the flags given on the command line by dest, ``file_values`` the config
    file's values by dest. Raises :class:`~gpunode.common.errors.UsageError` for a bad env value.
    """
    from gpunode.common.cli import resolve as resolve_flags

    values, sources = resolve_flags(flags_of(cls), argv_values, environ, file_values)
    return _build(cls, values), sources


def flat_values(settings: object) -> dict[str, Any]:
    """``{dest: value}`` of every flag of a settings instance (groups flattened)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if _GROUP in f.metadata:
            out.update(flat_values(value))
        else:
            out[f.name] = value
    return out


M = TypeVar("M", bound="BaseModel")


@dataclass(frozen=True)
class Parsed(Generic[S]):
    """One command line resolved: the typed settings, each flag's source, the loaded config file model
    (when the command reads one), and the raw argparse values (positionals too)."""

    settings: S
    sources: dict[str, Source]
    config: Any = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    def log_effective_config(self, cls: type[Any] | None = None, **fields: Any) -> None:
        """The one ``effective_config`` event, secrets redacted."""
        flags = flags_of(cls or type(self.settings))
        log_effective_config(flat_values(self.settings), self.sources, flags=flags, **fields)


class SettingsParser(Generic[S]):
    """The command line of one settings class: argparse built from the fields, precedence applied.

    ``aliases`` maps extra option strings (NVIDIA's spellings declared by one agent only, such as
    ``--nvidia-driver-root``) to a field name; ``configure`` adds positionals to the parser.
    ``parser`` declares the flags on an existing argparse parser (a sub-command's); else one is
    made with ``prog``, ``description`` and ``parser_kwargs`` (e.g. ``allow_abbrev=True``).
    """

    def __init__(
        self,
        cls: type[S],
        *,
        prog: str,
        description: str | None = None,
        aliases: Mapping[str, str] | None = None,
        configure: Callable[[FlagSet], None] | None = None,
        parser: argparse.ArgumentParser | None = None,
        **parser_kwargs: Any,
    ) -> None:
        self.cls = cls
        if parser is not None:
            self.flagset = FlagSet(parser)
        else:
            self.flagset = FlagSet(prog=prog, description=description, **parser_kwargs)
        for entry in _entries(cls):
            self.flagset.add_flag(entry.flag, short=entry.short, metavar=entry.metavar)
            for alias in entry.aliases:
                self.flagset.add_alias(alias, entry.flag)
            for option, dest in entry.then:
                self.flagset.add_alias(option, self.flagset.flags[dest])
        for option, dest in (aliases or {}).items():
            self.flagset.add_alias(option, self.flagset.flags[dest])
        if configure is not None:
            configure(self.flagset)

    @property
    def prog(self) -> str:
        return self.flagset.parser.prog

    def parse(
        self,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        config_model: type[BaseModel] | None = None,
        *,
        exit_on_error: bool = True,
    ) -> Parsed[S]:
        """Command line + environment (+ the ``--config-file`` model when given) -> :class:`Parsed`.

        Usage and config errors print ``prog: error: ...`` and exit 2, or raise when
        ``exit_on_error`` is False (see :meth:`gpunode.common.cli.FlagSet.parse`).
        """
        env = os.environ if environ is None else environ
        raw = self.flagset.parse(argv, env, config_model, exit_on_error=exit_on_error)
        return Parsed(_build(self.cls, raw.values), raw.sources, raw.config, raw.args)

    def resolve(
        self, args: Mapping[str, Any], environ: Mapping[str, str], config: BaseModel | None
    ) -> tuple[S, dict[str, Source]]:
        """Settings again for a (re)loaded config file, with flags and env vars still taking precedence."""
        from gpunode.common.cli import values_from_model

        return resolve(self.cls, args, environ, values_from_model(self.flagset.flags.values(), config))


@dataclass(frozen=True)
class CommonSettings:
    """The flags every agent has (names and env vars are a contract, see DESIGN.md)."""

    log_format: Literal["json", "console"] | None = setting(
        "--log-format",
        env="LOG_FORMAT",
        choices=LOG_FORMATS,
        metavar="json|console",
        help="log line format; json unless stderr is a terminal",
    )
    log_level: str = setting(
        "--log-level",
        env="LOG_LEVEL",
        type=parse_log_level,
        choices=LOG_LEVEL_CHOICES,
        default="info",
        metavar="LEVEL",
        help="least severe level logged: debug, info, warning, error, critical",
    )
    node_name: str | None = setting(
        "--node-name", env="NODE_NAME", metavar="NAME", help="this Kubernetes node's name"
    )
    simulate: str | None = setting(
        "--simulate",
        env="GPUNODE_SIMULATE",
        metavar="PRESET",
        help="run on a simulated node with this GPU preset instead of the real driver",
    )
    sim_state: str | None = setting(
        "--sim-state",
        env="GPUNODE_SIM_STATE",
        metavar="FILE",
        help="state file of the simulated node; processes given the same file share one node",
    )
    driver_root: str = setting(
        "--driver-root",
        env="NVIDIA_DRIVER_ROOT",
        default="/",
        metavar="DIR",
        help="where the NVIDIA driver's files are installed on the host",
    )


@dataclass(frozen=True)
class CommonWithConfigSettings(CommonSettings):
    """:class:`CommonSettings` plus ``--config-file`` (agents that read a YAML configuration file)."""

    config_file: str | None = setting(
        "--config-file", env="CONFIG_FILE", metavar="FILE", help="YAML configuration file"
    )


@dataclass(frozen=True)
class KubeSettings:
    """The Kubernetes API flags (the node's own name is ``--node-name`` / ``NODE_NAME``)."""

    kubeconfig: str | None = setting(
        "--kubeconfig",
        env="KUBECONFIG",
        metavar="FILE",
        help="kubeconfig file; default: the pod's service account (in-cluster)",
    )
    namespace: str = setting(
        "--namespace",
        env="NAMESPACE",
        default="default",
        metavar="NS",
        help="namespace of the objects this agent writes",
    )
    kube_api_timeout: float = setting(
        "--kube-api-timeout",
        env="KUBE_API_TIMEOUT",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="timeout of each Kubernetes API request (retried with backoff when the server is unreachable)",
    )


_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def listen_address(raw: str) -> str:
    """An IP address (``[::1]`` as ``::1``) or a host name to listen on; ``ValueError`` otherwise."""
    value = raw.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(value) and not value.rpartition(".")[2].isdigit():  # 300.1.1.1 is no name
        return value
    raise ValueError(
        f"{raw!r} is not an IP address or host name (0.0.0.0: every IPv4 address, ::: every IPv6 one)"
    )


@dataclass(frozen=True)
class HttpSettings:
    """Where an agent serves ``/healthz``, ``/readyz`` and ``/metrics``. Each agent picks its own port:
    ``http: HttpSettings = group(HttpSettings, defaults={"http_port": 9451})``."""

    http_address: str | None = setting(
        "--http-address",
        env="GPUNODE_HTTP_ADDRESS",
        type=listen_address,
        metavar="ADDRESS",
        default_help="",
        help="address of /healthz, /readyz and /metrics; default: every address (0.0.0.0) in a pod, "
        "127.0.0.1 under systemd",
    )
    http_port: int = setting(
        "--http-port",
        env="GPUNODE_HTTP_PORT",
        type=int,
        default=-1,
        metavar="PORT",
        help="port of /healthz, /readyz and /metrics (0: any free port, -1: off)",
    )

    def listen_host(self, environ: Mapping[str, str]) -> str:
        """``--http-address``, else 127.0.0.1 under systemd and 0.0.0.0 elsewhere
        (:func:`gpunode.common.httpcore.default_listen_host`)."""
        if self.http_address is not None:
            return self.http_address
        from gpunode.common.httpcore import default_listen_host

        return default_listen_host(environ)
