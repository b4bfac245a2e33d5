"""The two generators' command lines: --help prints usage, an option is never taken for a file name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.deploy import alerts, dashboard


@pytest.mark.parametrize("module", [alerts, dashboard])
def test_help_prints_usage_and_writes_nothing(
    module: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert module.main(["--help"]) == 0  # type: ignore[attr-defined]
    assert capsys.readouterr().out.startswith("usage: python -m gpunode.deploy.")
    assert module.main(["--bogus"]) == 2  # type: ignore[attr-defined]
    assert list(tmp_path.iterdir()) == []


def test_alerts_to_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert alerts.main(["-"]) == 0
    assert capsys.readouterr().out == alerts.rule_file_text()
