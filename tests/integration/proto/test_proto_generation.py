"""The generator round trip: protos/generate.py (grpcio-tools) regenerates the committed kubelet API code
byte for byte, and does so deterministically. Runs the code generator, so it is no unit test; the wire
contract of the generated code is checked in tests/unit/proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GENERATED = REPO / "agents" / "gpunode" / "_proto"
GENERATE = REPO / "protos" / "generate.py"


def _generated_files(root: Path) -> dict[Path, bytes]:
    return {
        path.relative_to(root): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.suffix in {".py", ".pyi"} and "__pycache__" not in path.parts
    }


def test_committed_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    subprocess.run([sys.executable, str(GENERATE), "--out", str(out)], check=True, capture_output=True)
    fresh, committed = _generated_files(out), _generated_files(GENERATED)
    assert sorted(fresh) == sorted(committed), "file set differs: run `python protos/generate.py`"
    stale = [str(rel) for rel in fresh if fresh[rel] != committed[rel]]
    assert not stale, f"out of date (run `python protos/generate.py`): {stale}"


def test_generation_is_deterministic(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, str(GENERATE), "--out", str(tmp_path / name)], check=True, capture_output=True
        )
        runs.append(_generated_files(tmp_path / name))
    assert runs[0] == runs[1]
