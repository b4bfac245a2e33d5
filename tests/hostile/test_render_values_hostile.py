"""gpunode render --values against hostile files, as a real process under the limits of
test_config_loaders_process.py (1 GiB address space, 10 s): exit 2, the file named, no traceback, quickly.
The values file goes through the same safe YAML loader as every other config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.hostile import BIN, INPUTS, run_limited

TIME_LIMIT = 5.0  # seconds; typically under 1


@pytest.mark.parametrize("hostile", list(INPUTS))
def test_hostile_values_file_exits_2_naming_the_file(tmp_path: Path, hostile: str) -> None:
    path = tmp_path / f"{hostile}.yaml"
    path.write_bytes(INPUTS[hostile]())
    out = run_limited([str(BIN / "gpunode"), "render", "--values", str(path)], timeout=10)
    assert not out.timed_out, f"render --values on {hostile}: still running after 10 s"
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(path) in out.stderr
    assert "Traceback" not in out.stderr
    assert out.seconds < TIME_LIMIT, f"render --values on {hostile}: {out.seconds:.2f} s"


def test_a_values_file_of_many_unknown_keys_warns_boundedly(tmp_path: Path) -> None:
    """20,000 keys the chart does not have: one warning each, no time or memory blow-up; --strict lists
    20 of them then the count."""
    path = tmp_path / "values.yaml"
    path.write_text("".join(f"k{i}: 1\n" for i in range(20_000)), encoding="utf-8")
    out = run_limited([str(BIN / "gpunode"), "render", "--values", str(path), "--strict"], timeout=10)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "... and 19980 more problems" in out.stderr
    assert len(out.stderr) < 10_000
    assert out.seconds < TIME_LIMIT
