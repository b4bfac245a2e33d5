"""Hostile sizes against the bounds of issue 14 item 2: exit code (or gRPC status), peak RSS and time.

    .venv/bin/python benchmarks/hostile_bounds.py                        # this tree only
    .venv/bin/python benchmarks/hostile_bounds.py --base /path/to/old    # this tree and an older checkout
    .venv/bin/python benchmarks/hostile_bounds.py --hook-mb 800 --csv-lines 2000000 --json

The cases:

* ``mig-count-N``: ``gpunode-mig apply`` on a simulated DGX A100 with ``{"1g.5gb": N}`` for N = 8,
  50 000 000, 2 000 000 000, 10^23 and ``1.0e+23`` (exit 2 at load now; the planner built an N-element
  list);
* ``hook-output``: an ``apply-start`` hook that prints ``--hook-mb`` MB and fails (the output was
  captured whole; now a 64 KiB tail);
* ``counters-csv``: ``gpunode-exporter -f`` with ``--csv-lines`` bad lines (every problem was printed;
  now 20 and a count);
* ``allocate-id``: a running device plugin sent an Allocate whose one device ID is ``--id-mib`` MiB
  (the ID was echoed whole into the status and the log line): the gRPC status, the length of its
  message and of the plugin's longest log line, the plugin's peak RSS (``VmHWM``) and the call's time.

Every process runs under ``RLIMIT_AS`` (1 GiB) and a time limit (20 s; 124 = killed there); an older
checkout runs with ``PYTHONPATH=<base>/agents`` in front of this venv's editable install. A report, not
a test (``tests/hostile/test_bounds.py`` asserts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.hostile import BIN, GIB, GOOD_MIG_CONFIG, clean_env, run_limited

MIB = 1 << 20
COUNTS = ("8", "50000000", "2000000000", "1" + "0" * 23, "1.0e+23")


@dataclass(frozen=True)
class Row:
    case: str
    tree: str
    result: str  # an exit code, or a gRPC status
    peak_rss_mb: float
    seconds: float
    detail: str = ""


def mig_layout(count: str) -> str:
    return (
        "version: v1\nmig-configs:\n  huge:\n    - devices: all\n      mig-enabled: true\n"
        f'      mig-devices: {{"1g.5gb": {count}}}\n'
    )


def hooks_file(megabytes: int) -> str:
    script = f"head -c {megabytes * 1_000_000} /dev/zero; echo failing >&2; exit 1"
    return f"version: v1\nhooks:\n  apply-start:\n    - command: /bin/sh\n      args: ['-c', '{script}']\n"


def counters_csv(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for k in range(lines):
            out.write(f"DCGM_FI_BAD_{k}, gauge, x\n")


def process_cases(hook_mb: int, csv_lines: int) -> dict[str, Callable[[Path], list[str]]]:
    def mig(count: str) -> Callable[[Path], list[str]]:
        def argv(tmp: Path) -> list[str]:
            (tmp / "layout.yaml").write_text(mig_layout(count))
            layout = [
                "-f",
                str(tmp / "layout.yaml"),
                "-c",
                "huge",
                "--journal-file",
                str(tmp / "journal.json"),
            ]
            return [str(BIN / "gpunode-mig"), "apply", "--simulate", "dgx-a100", *layout]

        return argv

    def hook(tmp: Path) -> list[str]:
        (tmp / "hooks.yaml").write_text(hooks_file(hook_mb))
        good = ["-f", str(GOOD_MIG_CONFIG), "-c", "all-disabled", "--journal-file", str(tmp / "journal.json")]
        return [str(BIN / "gpunode-mig"), "apply", "--simulate", "t4x4", *good, "-k", str(tmp / "hooks.yaml")]

    def csv(tmp: Path) -> list[str]:
        counters_csv(tmp / "counters.csv", csv_lines)
        return [str(BIN / "gpunode-exporter"), "--simulate", "t4x4", "-f", str(tmp / "counters.csv")]

    cases = {f"mig-count-{c}": mig(c) for c in COUNTS}
    cases[f"hook-output-{hook_mb}MB"] = hook
    cases[f"counters-csv-{csv_lines}-lines"] = csv
    return cases


def run_process(name: str, argv_of: Callable[[Path], list[str]], tree: Path | None, label: str) -> Row:
    with tempfile.TemporaryDirectory(prefix="bounds-") as tmp:
        argv = argv_of(Path(tmp))
        o = run_limited(argv, env=clean_env(tree), memory=GIB, timeout=20.0)
    lines = o.stderr.splitlines()
    detail = f"stderr {len(o.stderr)} chars, {len(lines)} lines" + (" tb" if "Traceback" in o.stderr else "")
    return Row(name, label, str(o.returncode), round(o.peak_rss_mb, 1), round(o.seconds, 2), detail)


def _vm_hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def allocate_huge_id(tree: Path | None, label: str, id_mib: float) -> Row:
    import grpc

    from gpunode._proto.deviceplugin.v1beta1 import api_pb2 as pb
    from gpunode._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

    name = f"allocate-id-{id_mib:g}MiB"
    with tempfile.TemporaryDirectory(prefix="bounds-") as tmp:
        root = Path(tmp)
        log = root / "plugin.log"
        (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
        argv = [str(BIN / "gpunode-device-plugin"), "--simulate", "t4x4", "--kubelet-socket", ""]
        argv += ["--host-root", str(root), "--http-port", "-1", "--log-format", "json"]

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(tree), preexec_fn=limit
            )
        sock = root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
        deadline = time.monotonic() + 20
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not sock.exists():
            proc.kill()
            proc.wait()
            said = log.read_text(errors="replace")[-300:]
            return Row(name, label, f"no socket (exit {proc.returncode})", float("nan"), 0.0, said)
        huge = "GPU-" + "0" * int(id_mib * MIB)
        options = [("grpc.max_send_message_length", 16 * MIB), ("grpc.max_receive_message_length", 16 * MIB)]
        with grpc.insecure_channel(f"unix://{sock}", options=options) as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[huge])])
            started = time.monotonic()
            try:
                stub.Allocate(request, timeout=15)
                status, message = "OK", ""
            except grpc.RpcError as exc:
                status, message = exc.code().name, exc.details() or ""
            seconds = time.monotonic() - started
            try:
                stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
                alive = "serving after"
            except grpc.RpcError as exc:
                alive = f"then {exc.code().name}"
        rss = _vm_hwm_mb(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        longest = max((len(line) for line in log.read_bytes().splitlines()), default=0)
    detail = f"message {len(message)} chars, longest log line {longest} chars, {alive}"
    return Row(name, label, status, round(rss, 1), round(seconds, 2), detail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="an older checkout to compare with (its agents/ is used)")
    parser.add_argument("--hook-mb", type=int, default=800)
    parser.add_argument("--csv-lines", type=int, default=2_000_000)
    parser.add_argument("--id-mib", type=float, default=3.9)
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base is not None:
        trees.insert(0, ("base", args.base))
    rows: list[Row] = []
    cases = process_cases(args.hook_mb, args.csv_lines)
    for label, tree in trees:  # the processes first: a child forked after grpc is imported here
        for name, argv_of in cases.items():  # would start with (and report) this process's larger RSS
            if args.only and args.only not in name:
                continue
            rows.append(run_process(name, argv_of, tree, label))
            if not args.json:
                print(_line(rows[-1]), flush=True)
    for label, tree in trees:
        if not args.only or args.only in "allocate-id":
            rows.append(allocate_huge_id(tree, label, args.id_mib))
            if not args.json:
                print(_line(rows[-1]), flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


def _line(r: Row) -> str:
    return f"{r.case:32} {r.tree:10} {r.result:>18} {r.peak_rss_mb:8.1f} MB {r.seconds:7.2f} s  {r.detail}"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
