"""containers/Containerfile, read as text: its shape, not a build (no builder runs here)."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTAINERFILE = ROOT / "containers" / "Containerfile"
PYPROJECT = ROOT / "pyproject.toml"

BUILD_TOOLS = {"gcc", "g++", "cc", "clang", "make", "build-essential", "python3-dev", "libc6-dev", "cmake"}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    """Instructions with continuation lines joined and comment lines dropped (as the parser does)."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def _parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages and keyword == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            global_args[key.strip()] = value.strip()
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


def _resolve(base: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), base)


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return _parse(CONTAINERFILE.read_text())


def test_has_a_build_and_a_runtime_stage(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    assert len(stages) >= 2
    names = [s.name for s in stages]
    assert "build" in names
    final = stages[-1]
    copies = [rest for kw, rest in final.instructions if kw == "COPY"]
    assert any("--from=build" in c and "/venv" in c for c in copies), (
        "the runtime stage takes the build's venv"
    )


def _pinned(image: str) -> bool:
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    _, _, tag = image.rpartition("/")[2].partition(":")
    # An exact version in the tag (12.11-slim, 3.11.9-slim-bookworm), not latest / a bare codename.
    return bool(re.match(r"\d+\.\d+", tag))


def test_every_base_image_is_pinned(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    args, stages = parsed
    stage_names = {s.name for s in stages if s.name}
    for stage in stages:
        image = _resolve(stage.base, args)
        if image in stage_names:
            continue
        assert "$" not in image, f"unresolved base image {stage.base}"
        assert _pinned(image), f"{image}: pin it by digest or an exact version tag"


def test_build_and_runtime_share_the_python(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    """Debian 12's python3 (3.11) in the build stage, distroless python3-debian12 (3.11) at run time."""
    args, stages = parsed
    build = _resolve(stages[0].base, args)
    runtime = _resolve(stages[-1].base, args)
    assert re.search(r"debian:12(\.\d+)?-slim", build)
    assert "python3-debian12" in runtime


def test_the_final_stage_runs_as_non_root(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    users = [rest.strip() for kw, rest in stages[-1].instructions if kw == "USER"]
    assert users, "the final stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in {"0", "root"}
    assert user == "65532"


def test_no_build_tools_in_the_final_stage(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    final = stages[-1]
    assert not [rest for kw, rest in final.instructions if kw == "RUN"], "distroless: nothing to RUN"
    for kw, rest in final.instructions:
        words = set(shlex.split(rest.replace("\\", " "), posix=True)) if kw in {"RUN", "COPY"} else set()
        assert not words & BUILD_TOOLS, f"{kw} {rest}"
    for kw, rest in final.instructions:
        if kw == "COPY" and "--from=" in rest:
            assert "/venv" in rest, f"only the venv comes from the build stage: {rest}"


def test_oci_labels_and_licence(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    labels = " ".join(rest for kw, rest in stages[-1].instructions if kw == "LABEL")
    for key in ("source", "revision", "version", "created", "title", "description", "vendor", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    copies = [rest for kw, rest in stages[-1].instructions if kw == "COPY"]
    assert any(c.split()[0] == "LICENSE" and "/licenses/" in c for c in copies)
    assert (Path(__file__).parents[3] / "LICENSE").is_file()  # what the COPY takes


def test_console_scripts_promised_are_pyproject_scripts(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    """The scripts the file lists as on PATH are exactly pyproject's, and /venv/bin is on PATH."""
    _, stages = parsed
    scripts = set(tomllib.loads(PYPROJECT.read_text())["project"]["scripts"])
    text = CONTAINERFILE.read_text()
    promised_block = re.search(r"Every console script.*?\n((?:#\s+gpunode\S*(?:\s+gpunode\S*)*\n)+)", text)
    assert promised_block, "the runtime stage lists the console scripts it puts on PATH"
    promised = set(re.findall(r"gpunode[\w-]*", promised_block.group(1)))
    assert promised == scripts
    envs = " ".join(rest for kw, rest in stages[-1].instructions if kw == "ENV")
    path = re.search(r"PATH=(\S+)", envs)
    assert path
    assert path.group(1).split(":")[0] == "/venv/bin"
    cmd = [rest for kw, rest in stages[-1].instructions if kw == "CMD"]
    assert cmd
    assert any(s in cmd[-1] for s in scripts)


def test_no_nvidia_libraries_baked_in() -> None:
    text = "\n".join(_logical_lines(CONTAINERFILE.read_text()))
    assert "libnvidia" not in text
    assert "nvidia-ml" not in text.replace("nvidia-ml-py", "")
