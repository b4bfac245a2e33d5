"""gpunode.api.mig_hooks: mig-parted's hooks file, strictly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.api.mig_hooks import load_hooks, parse_hooks
from gpunode.common.errors import ConfigError

# ------------------------------------------------------------------------------------------ the file


def test_parse_full_file() -> None:
    spec = parse_hooks(
        """\
version: v1
hooks:
  apply-start:
    - command: /bin/bash
      args: ["-c", "echo start"]
      envs: {A: "1"}
      workdir: /etc/nvidia-mig-manager
  pre-apply-mode:
    - command: /usr/bin/systemctl
      args: [stop, kubelet.service]
    - command: /bin/true
  apply-exit:
    - command: /usr/bin/systemctl
      args: [start, --no-block, kubelet.service]
""",
        "hooks.yaml",
    )
    start = spec.commands("apply-start")
    assert len(start) == 1
    assert start[0].command == "/bin/bash"
    assert start[0].args == ("-c", "echo start")
    assert start[0].envs == {"A": "1"}
    assert start[0].workdir == "/etc/nvidia-mig-manager"
    assert [c.command for c in spec.commands("pre-apply-mode")] == ["/usr/bin/systemctl", "/bin/true"]
    assert spec.commands("pre-apply-config") == ()
    assert spec.commands("apply-exit")[0].args == ("start", "--no-block", "kubelet.service")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "version: v1\nhooks: {apply-start: [{command: bash}]}",
            "hooks.apply-start[0].command: must be an absolute path (hooks do not inherit PATH), not 'bash'",
            id="relative-command",
        ),
        pytest.param(
            "version: v1\nhooks: {apply-start: [{args: [x]}]}",
            "hooks.apply-start[0].command: required key is missing",
            id="no-command",
        ),
        pytest.param(
            "version: v1\nhooks: {apply-start: [{command: /bin/true, workdir: tmp}]}",
            "hooks.apply-start[0].workdir: must be an absolute path, not 'tmp'",
            id="relative-workdir",
        ),
        pytest.param(
            "version: v1\nhooks: {apply-start: [{command: /bin/true, envs: {A: 1}}]}",
            "hooks.apply-start[0].envs.A: must be a string, not an integer",
            id="env-number",
        ),
        pytest.param(
            'version: v1\nhooks: {apply-start: [{command: /bin/true, envs: {"A=B": x}}]}',
            "hooks.apply-start[0].envs: not valid environment variable names: 'A=B'",
            id="env-name",
        ),
        pytest.param(
            "version: v1\nhooks: {apply-start: [{command: /bin/true, arg: [x]}]}",
            "hooks.apply-start[0].arg: unknown key",
            id="unknown-command-key",
        ),
        pytest.param(
            "version: v1\nhooks: {post-apply: [{command: /bin/true}]}",
            "hooks.post-apply: unknown key",
            id="unknown-hook",
        ),
        pytest.param("hooks: {}", "version: required key is missing", id="no-version"),
        pytest.param("version: v2", 'version: must be v1 (got "v2")', id="bad-version"),
    ],
)
def test_bad_files(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_hooks(text, "hooks.yaml")
    assert info.value.path == "hooks.yaml"
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_load_hooks(tmp_path: Path) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text("version: v1\nhooks:\n  apply-exit: [{command: /bin/true}]\n")
    assert load_hooks(path).commands("apply-exit")[0].command == "/bin/true"
    with pytest.raises(ConfigError, match="file not found"):
        load_hooks(tmp_path / "nope.yaml")
