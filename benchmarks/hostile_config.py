"""Hostile config files against every YAML loader entry point: exit code, peak RSS and time (issue 14).

    .venv/bin/python benchmarks/hostile_config.py                       # this tree only
    .venv/bin/python benchmarks/hostile_config.py --base /path/to/old   # this tree and an older checkout
    .venv/bin/python benchmarks/hostile_config.py --json

Each entry point (device plugin and feature discovery ``--config-file``, ``gpunode-mig -f`` and ``-k``,
the MIG manager's GPU-clients file, ``gpunode render --policy``, ``--kubeconfig``) runs as a real process
on each hostile input (a ~500-byte alias bomb, 10^5 levels of nesting, a 5000-digit integer, a 2 MiB
file, non-UTF-8 bytes, and for the kubeconfig a syntax error next to its bearer token), under
``RLIMIT_AS`` (1 GiB) and a time limit (20 s) so that an old checkout cannot hurt the machine.
Reported: the exit code (124: killed at the time limit; MemoryError ends in exit 1), the process's
own peak RSS (``wait4``) and the wall time. An older checkout runs with ``PYTHONPATH=<base>/agents``
in front of this venv's editable install. A report, not a test (``tests/hostile`` asserts).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.hostile import (
    ENTRY_POINTS,
    GIB,
    INPUTS,
    TOKEN,
    Outcome,
    clean_env,
    kubeconfig_syntax_error,
    run_limited,
)

KUBECONFIG = "--kubeconfig"
TOKEN_INPUT = "kubeconfig-token"


def cases() -> list[tuple[str, str]]:
    out = [(hostile, entry) for hostile in INPUTS for entry in ENTRY_POINTS]
    out.append((TOKEN_INPUT, KUBECONFIG))
    return out


def run_case(hostile: str, entry: str, tree: Path | None, memory: int, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        path = Path(tmp) / "input.yaml"
        path.write_bytes(kubeconfig_syntax_error() if hostile == TOKEN_INPUT else INPUTS[hostile]())
        return run_limited(
            ENTRY_POINTS[entry](Path(tmp), path), env=clean_env(tree), memory=memory, timeout=timeout
        )


def cell(o: Outcome, hostile: str) -> str:
    leak = " TOKEN" if hostile == TOKEN_INPUT and TOKEN in o.stderr else ""
    trace = " tb" if "Traceback" in o.stderr else ""
    return f"{o.returncode:>4} {o.peak_rss_mb:6.0f} MB {o.seconds:6.2f} s{trace}{leak}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="an older checkout to compare with (its agents/ directory)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per run (default 20)")
    parser.add_argument("--memory", type=int, default=GIB, help="RLIMIT_AS per run in bytes (default 1 GiB)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.base is not None:
        trees.insert(0, ("before", args.base.resolve()))
    rows = []
    for hostile, entry in cases():
        row: dict[str, object] = {"input": hostile, "entry": entry}
        for label, tree in trees:
            o = run_case(hostile, entry, tree, args.memory, args.timeout)
            row[label] = {
                "exit": o.returncode,
                "peak_rss_mb": round(o.peak_rss_mb, 1),
                "seconds": round(o.seconds, 2),
                "traceback": "Traceback" in o.stderr,
                "token_shown": TOKEN in o.stderr,
                "names_file": "input.yaml" in o.stderr,
            }
            if not args.json:
                print(f"  {label:6} {hostile:16} {entry:32} {cell(o, hostile)}", file=sys.stderr, flush=True)
        rows.append((row, hostile))
    if args.json:
        print(json.dumps([r for r, _ in rows], indent=2))
        return 0
    head = f"{'input':16} {'entry point':32}"
    for label, _ in trees:
        head += f" | {label + ': exit   peak RSS     time':32}"
    print(head)
    print("-" * len(head))
    for row, hostile in rows:
        line = f"{row['input']:16} {row['entry']:32}"
        for label, _ in trees:
            r = row[label]
            assert isinstance(r, dict)
            o = Outcome(r["exit"], "", r["seconds"], r["peak_rss_mb"], r["exit"] == 124)
            extra = (" tb" if r["traceback"] else "") + (" TOKEN" if r["token_shown"] else "")
            line += f" | {cell(o, hostile)}{extra:6}"
        print(line)
    print(
        "\nexit 124: killed at the time limit; tb: a traceback on stderr; TOKEN: the bearer token on stderr"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
