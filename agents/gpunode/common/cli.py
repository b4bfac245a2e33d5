"""argparse with an environment variable behind every flag, and one pure precedence function.

Precedence for every setting: command-line flag > environment variable > config file > default.
:func:`resolve` implements it without touching the process (it takes the parsed flags, an environment
mapping and the file's values) and reports where each value came from; :class:`FlagSet` wires it to
argparse, the config file (``--config-file``) and exit code 2 for usage errors.

A typical entry point::

    flags = FlagSet(prog="gpunode-device-plugin", description=__doc__)
    add_common_flags(flags)
    flags.add("--mig-strategy", env="MIG_STRATEGY", choices=("none", "single", "mixed"),
              default="none", file_key="flags.migStrategy", help="how MIG devices are exposed")
    settings = flags.parse(argv, config_model=DevicePluginConfig)   # exits 2 on usage/config errors
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypeGuard, TypeVar, overload

from gpunode.common.errors import ConfigError, UsageError

if TYPE_CHECKING:  # pydantic and PyYAML load only when a config file is actually read (memory, start-up)
    from pydantic import BaseModel

    from gpunode.common.logging import Logger

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVEL_CHOICES",
    "Flag",
    "FlagSet",
    "Settings",
    "Source",
    "UsageError",
    "add_common_flags",
    "add_kube_flags",
    "log_effective_config",
    "parse_bool",
    "parse_duration",
    "parse_interval",
    "parse_log_level",
    "resolve",
    "split_verb",
    "values_from_model",
]

Source = Literal["flag", "env", "file", "default"]
M = TypeVar("M", bound="BaseModel")

LOG_FORMATS = ("json", "console")
LOG_LEVEL_CHOICES = ("debug", "info", "warning", "error", "critical")

_TRUE = frozenset({"true", "1", "yes", "on", "t"})  # "t"/"f": Go's strconv.ParseBool, as NVIDIA's agents
_FALSE = frozenset({"false", "0", "no", "off", "f"})


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` in any case; ``ValueError`` otherwise."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected true/false, 1/0, yes/no or on/off")


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(text: str) -> float:
    """Seconds from ``300``, ``2.5`` or a Go duration (``0s``, ``5m``, ``1h30m``, ``500ms``); not negative."""
    raw = text.strip()
    if _PLAIN_NUMBER.fullmatch(raw):
        return float(raw)
    body = raw[1:] if raw.startswith("+") else raw
    total, pos = 0.0, 0
    while body and pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if match is None:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise ValueError(
            f"invalid duration {text!r}: give seconds (300) or a Go duration (5m, 1h30m, 0s); "
            "negative durations are not allowed"
        )
    return total


#: Go's longest ``time.Duration`` (2**63 - 1 ns), the most NVIDIA's agents accept.
MAX_INTERVAL_SECONDS = (2**63 - 1) / 1e9


def parse_interval(text: str | float) -> float | None:
    """A sleep interval: a duration (as :func:`parse_duration`, any case) that must be positive, or
    ``infinite`` (None), as ``GFD_SLEEP_INTERVAL`` takes it."""
    t = (text if isinstance(text, str) else str(text)).strip().lower()  # a YAML number: seconds
    if t == "infinite":
        return None
    value = parse_duration(t)
    if value <= 0:
        raise ValueError("must be positive (or 'infinite')")
    if value > MAX_INTERVAL_SECONDS:
        raise ValueError("is longer than the longest duration Go allows (about 292 years); use 'infinite'")
    return value


@dataclass(frozen=True)
class Flag:
    """One setting: its flag, environment variables, config-file key, type and default."""

    option: str
    dest: str
    envs: tuple[str, ...] = ()
    type: Callable[[str], Any] = str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    is_bool: bool = False
    help: str = ""
    file_key: str | None = None
    secret: bool = False
    required: bool = False  # argparse insists on it
    negatable: bool = True  # a bool flag also has --no-<name> (and takes --flag=false)
    repeatable: bool = False  # given once per value (a tuple); its env var is a comma-separated list
    default_help: str | None = None  # how --help shows the default (None: the default itself; "": hidden)

    def convert(self, raw: str) -> Any:
        """Parse a string value to the flag's type; ``ValueError`` with a readable reason."""
        try:
            value = parse_bool(raw) if self.is_bool else self.type(raw)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            reason = str(exc) or f"not a valid {getattr(self.type, '__name__', 'value')}"
            raise ValueError(reason) from None
        if self.choices is not None and value not in self.choices:
            raise ValueError("must be one of " + ", ".join(str(c) for c in self.choices))
        return value

    def from_file(self, value: object) -> Any:
        """Convert a value from a free-form block of a config file (``flags.gfd``), in every form
        NVIDIA's files use: booleans as YAML booleans or strings, numbers or strings for durations and
        numbers, lists or comma strings for repeatable flags; ``ValueError`` with a readable reason."""
        if self.is_bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                return self.convert(value)
            raise ValueError("must be a boolean (true or false)")
        if isinstance(value, bool):
            raise ValueError("must be a string or a number, not a boolean")
        if self.repeatable:
            if isinstance(value, str):
                items: Sequence[object] = value.split(",")
            elif isinstance(value, list | tuple):
                items = value
            else:
                raise ValueError("must be a list or a comma-separated string")
            out = []
            for item in items:
                if isinstance(item, bool) or not isinstance(item, str | int | float):
                    raise ValueError("list items must be strings or numbers")
                text = str(item).strip()
                if text:
                    out.append(self.convert(text))
            return tuple(out)
        if isinstance(value, int | float):
            return self.convert(str(value))
        if isinstance(value, str):
            return self.convert(value)
        raise ValueError("must be a string or a number")

    def from_env(self, name: str, raw: str) -> Any:
        """Parse an environment variable's value; :class:`UsageError` naming the variable otherwise."""
        try:
            if self.repeatable:
                return tuple(self.convert(part.strip()) for part in raw.split(",") if part.strip())
            return self.convert(raw)
        except ValueError as exc:
            if self.secret:  # the reason may quote the value
                raise UsageError(
                    f"environment variable {name}=<redacted> (for {self.option}) is invalid"
                ) from None
            raise UsageError(
                f"environment variable {name}={raw!r} (for {self.option}) is invalid: {exc}"
            ) from None


def resolve(
    flags: Iterable[Flag],
    argv_values: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Source]]:
    """Effective value and source of every flag: flag > env var > config file > default.

    ``argv_values`` holds only the flags given on the command line (by dest); ``environ`` is the
    environment (an empty variable counts as unset); ``file_values`` holds the config file's values by
    dest (None values count as unset). Pure: raises :class:`UsageError` for an unparsable env value.
    """
    effective: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    files = file_values or {}
    for flag in flags:
        dest = flag.dest
        if dest in argv_values:
            effective[dest], sources[dest] = argv_values[dest], "flag"
            continue
        env_name = next((name for name in flag.envs if environ.get(name, "") != ""), None)
        if env_name is not None:
            effective[dest], sources[dest] = flag.from_env(env_name, environ[env_name]), "env"
        elif files.get(dest) is not None:
            effective[dest], sources[dest] = files[dest], "file"
        else:
            effective[dest], sources[dest] = flag.default, "default"
    return effective, sources


def values_from_model(
    flags: Iterable[Flag], model: BaseModel | None, *, source: str = "config file"
) -> dict[str, Any]:
    """The config file's values for flags with a ``file_key``, keyed by dest.

    ``file_key`` is a dotted path through the model, in YAML (camelCase) or Python spelling
    (``flags.migStrategy``). Only keys actually written in the file count, so a model's own field
    defaults never shadow a flag's default. A value read from a free-form block of the model (a
    mapping, such as ``flags.gfd``) is converted to the flag's type (:meth:`Flag.from_file`); one that
    cannot be raises :class:`ConfigError` naming ``source`` and the key.
    """
    if model is None:
        return {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for flag in flags:
        if flag.file_key is None:
            continue
        found, value, free_form = _lookup(model, flag.file_key.split("."))
        if not found or value is None:
            continue
        if free_form:
            try:
                value = flag.from_file(value)
            except ValueError as exc:
                problems.append(f"{flag.file_key}: {exc} (got {value!r:.80})")
                continue
        values[flag.dest] = value
    if problems:
        raise ConfigError(source, problems)
    return values


def _lookup(obj: object, parts: Sequence[str]) -> tuple[bool, Any, bool]:
    """(found, value, whether the value came from a free-form mapping rather than a typed field)."""
    current = obj
    free_form = False
    for part in parts:
        if _is_model(current):
            name = _field_name(type(current), part)
            if name is None or name not in current.model_fields_set:
                return False, None, False
            current = getattr(current, name)
        elif isinstance(current, Mapping):
            if part not in current:
                return False, None, False
            current = current[part]
            free_form = True
        else:
            return False, None, False
    return True, current, free_form


def _is_model(obj: object) -> TypeGuard[BaseModel]:
    """A pydantic model instance, recognised without importing pydantic."""
    return hasattr(type(obj), "model_fields") and hasattr(obj, "model_fields_set")


def _field_name(model: type[BaseModel], key: str) -> str | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return name
    return None


@dataclass(frozen=True)
class Settings(Generic[M]):
    """The outcome of :meth:`FlagSet.parse`."""

    values: dict[str, Any]
    sources: dict[str, Source]
    config: M | None = None
    args: dict[str, Any] = field(default_factory=dict)  # the raw argparse namespace (positionals too)

    def __getitem__(self, dest: str) -> Any:
        return self.values[dest]


class _BoolAction(argparse.Action):
    """``--flag`` / ``--no-flag``; ``--flag=false`` is rewritten to ``--no-flag`` before parsing."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        negated = [f"--no-{opt[2:]}" for opt in option_strings if opt.startswith("--")]
        self.negated = frozenset(negated)  # a flag may itself be named --no-something (--no-timestamp)
        super().__init__([*option_strings, *negated], dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negated)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class FlagSet:
    """Flags of one command, each with env vars and an optional config-file key."""

    def __init__(self, parser: argparse.ArgumentParser | None = None, **parser_kwargs: Any) -> None:
        if parser is None:
            parser_kwargs.setdefault("allow_abbrev", False)
            parser_kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
            parser = argparse.ArgumentParser(**parser_kwargs)
        self.parser = parser
        self.flags: dict[str, Flag] = {}

    def add(
        self,
        option: str,
        *,
        env: str | Sequence[str] | None = None,
        type: Callable[[str], Any] = str,
        default: Any = None,
        choices: Sequence[Any] | None = None,
        help: str = "",
        metavar: str | None = None,
        dest: str | None = None,
        file_key: str | None = None,
        secret: bool = False,
        short: str | None = None,
    ) -> Flag:
        """Declare ``option`` (``--long-name``); ``type=bool`` makes a ``--x/--no-x`` switch."""
        if not option.startswith("--"):
            raise ValueError(f"flag must start with '--': {option!r}")
        envs = (env,) if isinstance(env, str) else tuple(env or ())
        flag = Flag(
            option=option,
            dest=dest or option[2:].replace("-", "_"),
            envs=envs,
            type=type,
            default=default,
            choices=tuple(choices) if choices is not None else None,
            is_bool=type is bool,
            help=help,
            file_key=file_key,
            secret=secret,
        )
        return self.add_flag(flag, short=short, metavar=metavar)

    def add_flag(self, flag: Flag, *, short: str | None = None, metavar: str | None = None) -> Flag:
        """Declare an already built :class:`Flag` (what :mod:`gpunode.common.settings` does per field)."""
        if flag.dest in self.flags:
            raise ValueError(f"flag {flag.option} declared twice")
        names = [short, flag.option] if short else [flag.option]
        text = _help_text(flag)
        if flag.is_bool:
            self.parser.add_argument(
                *names,
                dest=flag.dest,
                default=argparse.SUPPRESS,
                required=flag.required,
                help=text,
                **({"action": _BoolAction} if flag.negatable else {"action": "store_const", "const": True}),
            )
        else:
            self.parser.add_argument(
                *names,
                dest=flag.dest,
                action="append" if flag.repeatable else "store",
                type=_argparse_type(flag),
                choices=flag.choices,
                default=argparse.SUPPRESS,
                required=flag.required,
                metavar=metavar,
                help=text,
            )
        self.flags[flag.dest] = flag
        return flag

    def add_alias(self, option: str, flag: Flag, *, help: str | None = None) -> None:
        """Another option string for ``flag``'s value (one of NVIDIA's spellings), e.g. ``-n``."""
        text = help if help is not None else f"alias of {flag.option}"
        if flag.is_bool:
            self.parser.add_argument(
                option, dest=flag.dest, action=_BoolAction, default=argparse.SUPPRESS, help=text
            )
        else:
            self.parser.add_argument(
                option, dest=flag.dest, type=_argparse_type(flag), default=argparse.SUPPRESS, help=text
            )

    # ------------------------------------------------------------------------------------ parsing

    def parse_args(self, argv: Sequence[str] | None = None) -> dict[str, Any]:
        """Parse the command line (argparse exits 2 on errors); only given flags appear in the result."""
        args = list(sys.argv[1:] if argv is None else argv)
        values = dict(vars(self.parser.parse_args(self._rewrite_bool_values(args))))
        for flag in self.flags.values():
            if flag.repeatable and flag.dest in values:
                values[flag.dest] = tuple(values[flag.dest])
        return values

    def resolve(
        self,
        argv_values: Mapping[str, Any],
        environ: Mapping[str, str],
        file_values: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Source]]:
        """:func:`resolve` over this set's flags."""
        return resolve(self.flags.values(), argv_values, environ, file_values)

    @overload
    def parse(
        self,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        config_model: None = None,
        *,
        config_dest: str = "config_file",
        exit_on_error: bool = True,
    ) -> Settings[Any]: ...

    @overload
    def parse(
        self,
        argv: Sequence[str] | None,
        environ: Mapping[str, str] | None,
        config_model: type[M],
        *,
        config_dest: str = "config_file",
        exit_on_error: bool = True,
    ) -> Settings[M]: ...

    @overload
    def parse(
        self,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        config_model: type[M],
        config_dest: str = "config_file",
        exit_on_error: bool = True,
    ) -> Settings[M]: ...

    def parse(
        self,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        config_model: type[M] | None = None,
        *,
        config_dest: str = "config_file",
        exit_on_error: bool = True,
    ) -> Settings[M] | Settings[Any]:
        """Command line + environment + config file -> :class:`Settings`.

        When ``config_model`` is given and ``--config-file`` (or its env var) names a file, the file is
        loaded with :func:`~gpunode.common.config.load_config` and its values take part in the
        precedence (without ``config_model`` the path is only returned, for the caller to use).
        Usage and config errors print ``prog: error: ...`` and exit 2 (``SystemExit``), or raise
        :class:`UsageError`/:class:`ConfigError` when ``exit_on_error`` is False.
        """
        env = os.environ if environ is None else environ
        try:
            args = self.parse_args(argv)
            values, sources = self.resolve(args, env)
            config: M | None = None
            path = values.get(config_dest)
            if config_model is not None and path:
                from gpunode.common.config import load_config

                config = load_config(path, config_model)
                values, sources = self.resolve(
                    args, env, values_from_model(self.flags.values(), config, source=str(path))
                )
        except UsageError as exc:
            if not exit_on_error:
                raise
            self.parser.print_usage(sys.stderr)
            self._fail(str(exc))
        except ConfigError as exc:
            if not exit_on_error:
                raise
            self._fail(f"invalid config file {exc}")
        return Settings(values=values, sources=sources, config=config, args=args)

    def _fail(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.parser.prog}: error: {message}\n")
        raise SystemExit(2)

    def _rewrite_bool_values(self, args: list[str]) -> list[str]:
        """``--flag=false`` -> ``--no-flag`` (and ``=true`` -> ``--flag``), as urfave/cli accepts it."""
        bool_options = {flag.option: flag for flag in self.flags.values() if flag.is_bool and flag.negatable}
        if not bool_options:
            return args
        out: list[str] = []
        for index, arg in enumerate(args):
            if arg == "--":
                out.extend(args[index:])
                break
            option, sep, raw = arg.partition("=")
            flag = bool_options.get(option)
            if not sep or flag is None:
                out.append(arg)
                continue
            try:
                value = parse_bool(raw)
            except ValueError as exc:
                self.parser.error(f"argument {option}: invalid value {raw!r}: {exc}")
            out.append(option if value else f"--no-{option[2:]}")
        return out


def _argparse_type(flag: Flag) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return flag.type(raw)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"invalid value {raw!r}: {exc}") from None

    convert.__name__ = getattr(flag.type, "__name__", "value")
    return convert


def _help_text(flag: Flag) -> str:
    parts = [flag.help.replace("%", "%%")] if flag.help else []
    if flag.envs:
        listed = ", comma list" if flag.repeatable else ""
        parts.append("[env " + ", ".join(f"${name}" for name in flag.envs) + listed + "]")
    if flag.default_help is not None:
        shown: str | None = flag.default_help or None
    elif flag.default is None or flag.default == () or flag.secret:
        shown = None
    else:
        shown = str(flag.default).lower() if flag.is_bool else str(flag.default)
    if shown is not None:
        parts.append(f"(default: {shown.replace('%', '%%')})")
    return " ".join(parts)


def add_common_flags(flags: FlagSet, *, config_file: bool = True) -> None:
    """The flags every agent has (names and env vars are a contract, see DESIGN.md).

    ``config_file=False`` leaves out ``--config-file`` for commands that read no configuration file.
    """
    flags.add(
        "--log-format",
        env="LOG_FORMAT",
        choices=LOG_FORMATS,
        metavar="json|console",
        help="log line format; json unless stderr is a terminal",
    )
    flags.add(
        "--log-level",
        env="LOG_LEVEL",
        type=parse_log_level,
        choices=LOG_LEVEL_CHOICES,
        default="info",
        metavar="LEVEL",
        help="least severe level logged: debug, info, warning, error, critical",
    )
    flags.add("--node-name", env="NODE_NAME", metavar="NAME", help="this Kubernetes node's name")
    flags.add(
        "--simulate",
        env="GPUNODE_SIMULATE",
        metavar="PRESET",
        help="run on a simulated node with this GPU preset instead of the real driver",
    )
    flags.add(
        "--sim-state",
        env="GPUNODE_SIM_STATE",
        metavar="FILE",
        help="state file of the simulated node; processes given the same file share one node",
    )
    flags.add(
        "--driver-root",
        env="NVIDIA_DRIVER_ROOT",
        default="/",
        metavar="DIR",
        help="where the NVIDIA driver's files are installed on the host",
    )
    if config_file:
        flags.add("--config-file", env="CONFIG_FILE", metavar="FILE", help="YAML configuration file")


def split_verb(
    prog: str, argv: Sequence[str] | None, verbs: Sequence[str], usage: str | None
) -> tuple[str, list[str]] | int:
    """``prog VERB [flags]``: (verb, the rest), or the exit code after printing usage (``-h``: 0, none: 2)
    or an error naming the commands (unknown verb: 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage or "")
        return 0 if args else 2
    if args[0] not in verbs:
        print(
            f"{prog}: error: unknown command {args[0]!r}; the commands are: {', '.join(verbs)}",
            file=sys.stderr,
        )
        return 2
    return args[0], args[1:]


def add_kube_flags(
    flags: FlagSet, *, namespace_help: str = "namespace of the objects this agent writes"
) -> None:
    """The Kubernetes API flags (the node's own name comes from ``--node-name`` / ``NODE_NAME``)."""
    flags.add(
        "--kubeconfig",
        env="KUBECONFIG",
        metavar="FILE",
        help="kubeconfig file; default: the pod's service account (in-cluster)",
    )
    flags.add("--namespace", env="NAMESPACE", default="default", metavar="NS", help=namespace_help)
    flags.add(
        "--kube-api-timeout",
        env="KUBE_API_TIMEOUT",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="timeout of each Kubernetes API request (retried with backoff when the server is unreachable)",
    )


def parse_log_level(raw: str) -> str:
    """``WARN`` and friends -> ``warning``; case-insensitive."""
    level = raw.strip().lower()
    return "warning" if level == "warn" else level


def log_effective_config(
    effective: Mapping[str, Any],
    sources: Mapping[str, Source],
    *,
    flags: Iterable[Flag] = (),
    log: Logger | None = None,
    **fields: Any,
) -> None:
    """Log the effective configuration once, as the single event ``effective_config``.

    Values of flags declared ``secret`` are replaced by ``"<redacted>"``. ``log`` defaults to the
    ``gpunode.config`` logger; extra ``fields`` are added to the event.
    """
    secret = {flag.dest for flag in flags if flag.secret}
    config = {
        key: ("<redacted>" if key in secret and value is not None else _json_safe(value))
        for key, value in effective.items()
    }
    if log is None:
        from gpunode.common.logging import get_logger

        log = get_logger("gpunode.config")
    log.info("effective_config", config=config, sources=dict(sources), **fields)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if _is_model(value):
        return value.model_dump(mode="json", by_alias=True)
    return str(value)
