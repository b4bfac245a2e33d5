"""Container start with gpunode's CDI spec against the same container with no device (issue 16: p50
overhead <= 50 ms), measured with podman in one run.

    .venv/bin/python benchmarks/containers.py [--rounds 30] [--json]      (as root, podman installed)

Set-up as the container tests do it (tests/integration/containers): a fake driver root of an 8-GPU node
(device nodes with the driver's majors and minors, libraries with the driver's sonames, binaries,
firmware), a simulated dgx-a100, the spec from `gpunode-toolkit cdi generate` (which installs
gpunode-cdi-hook in a temp dir) put into /var/run/cdi under the tests' lock, podman with
containers/ci/containers.conf and the local base image (containers/ci/base-image.sh).

Each round runs, in rotating order so the machine's noise falls on all alike, `podman run --rm
--network none BASE true` with: no device; `--device nvidia.com/gpu=0`; `--device nvidia.com/gpu=all`;
and, to tell the hooks' share, device 0 of the same spec generated with `--disable-hook all` (another
kind, in a second file). Then each of the spec's hook entries is timed alone, run as runc runs it (the
OCI state on stdin) on a fresh copy of the image's root filesystem (gpunode's spec has one entry, its
steps joined by --then).
Each is timed from spawn to exit (the whole podman command: create, hooks, start, wait, remove).
Printed: p50/p90/max per case and the p50 overhead of each device case over no device. A report, not a
test; exit 1 only when the set-up fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from benchlib import load_average, machine_base, percentile  # noqa: E402
from gpunode.sim import nvml as sim  # noqa: E402
from helpers import podman  # noqa: E402
from helpers.fakedriver import build_fake_driver  # noqa: E402
from helpers.gpucontainers import generate_spec  # noqa: E402

NO_HOOKS_KIND = "nohooks.bench.gpunode.dev/gpu"  # the same spec with --disable-hook all, for attribution
CASES = {
    "no device": [],
    "nvidia.com/gpu=0": ["--device", "nvidia.com/gpu=0"],
    "nvidia.com/gpu=all": ["--device", "nvidia.com/gpu=all"],
    "gpu=0, no hooks": ["--device", f"{NO_HOOKS_KIND}=0"],
}


def start_once(image: str, extra: list[str]) -> float:
    """Seconds for one `podman run --rm ... true`."""
    t0 = time.perf_counter()
    out = podman.podman("run", "--rm", "--network", "none", *extra, image, "true", timeout=120)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"podman run {' '.join(extra)} exited {out.returncode}: {out.stderr[-2000:]}")
    return took


def hook_name(argv: list[str]) -> str:
    """A hook entry's commands: one, or gpunode's steps joined by --then (``a+b+c``)."""
    args = argv[1:]
    return "+".join([args[0], *(args[i + 1] for i, a in enumerate(args[:-1]) if a == "--then")])


def hook_times(image: str, spec: Path, rounds: int, work: Path) -> dict[str, float]:
    """p50 ms of each of the spec's hooks run alone (as runc runs it: the OCI state on stdin) on a fresh
    copy of the image's root filesystem per round, the driver's libraries copied in where the spec
    mounts them (as the runtime has mounted them when the hooks run)."""
    doc = yaml.safe_load(spec.read_text())
    hooks = doc.get("containerEdits", {}).get("hooks") or []
    created = podman.podman("create", image, "true", check=True).stdout.strip()
    tar = work / "rootfs.tar"
    try:
        podman.podman("export", "-o", str(tar), created, check=True)
    finally:
        podman.podman("rm", created)
    times: dict[str, list[float]] = {}
    for round_no in range(rounds):
        bundle = work / f"bundle{round_no}"
        (bundle / "rootfs").mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(tar), "-C", str(bundle / "rootfs")], check=True)
        for mount in doc.get("containerEdits", {}).get("mounts") or []:
            if ".so" in mount["containerPath"]:
                dest = bundle / "rootfs" / mount["containerPath"].lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(mount["hostPath"], dest)
        config = {"ociVersion": "1.0.2", "root": {"path": str(bundle / "rootfs")}}
        (bundle / "config.json").write_text(json.dumps(config))
        state = json.dumps(
            {"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 1, "bundle": str(bundle)}
        )
        for hook in hooks:
            t0 = time.perf_counter()
            subprocess.run(
                [hook["path"], *hook["args"][1:]], input=state, text=True, capture_output=True, check=True
            )
            times.setdefault(hook_name(hook["args"]), []).append((time.perf_counter() - t0) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--hook-rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reason = podman.why_podman_cannot_run()
    if reason is not None:
        print(f"benchmarks/containers.py: podman cannot run containers here: {reason}", file=sys.stderr)
        return 1
    image = podman.BASE_IMAGE
    times: dict[str, list[float]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-") as tmp:
        base = Path(tmp)
        driver = build_fake_driver(base / "node")
        state = base / "node.json"
        sim.init_state_file(state, "dgx-a100")
        hook = str(base / "toolkit" / "gpunode-cdi-hook")
        spec_file, bare_file = base / "spec.yaml", base / "no-hooks.yaml"
        generate_spec(state, driver, hook, spec_file)
        generate_spec(state, driver, hook, bare_file, "--kind", NO_HOOKS_KIND, "--disable-hook", "all")
        with podman.cdi_spec("gpunode-bench.yaml") as spec:
            spec.write(spec_file.read_text())
            spec.sibling("gpunode-bench-no-hooks.yaml").write(bare_file.read_text())
            for _ in range(args.warmup):
                for extra in CASES.values():
                    start_once(image, extra)
            names = list(CASES)
            for round_no in range(args.rounds):
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for name in order:
                    times[name].append(start_once(image, CASES[name]) * 1000)
        hooks = hook_times(image, spec_file, args.hook_rounds, base)
    summary: dict[str, dict[str, float]] = {}
    for name, values in times.items():
        ordered = sorted(values)
        summary[name] = {
            "p50_ms": statistics.median(ordered),
            "p90_ms": percentile(ordered, 90),
            "max_ms": ordered[-1],
        }
    baseline = summary["no device"]["p50_ms"]
    for name in CASES:
        summary[name]["p50_overhead_ms"] = summary[name]["p50_ms"] - baseline
    if args.json:
        report = {"machine": machine_base(), "rounds": args.rounds, "results": summary, "hooks_p50_ms": hooks}
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"machine: {machine_base()['cpu']}, {machine_base()['cpus_usable']} CPUs, load {load_average()}; "
        f"{args.rounds} rounds of `podman run --rm --network none {image} true` (+{args.warmup} warm-up)"
    )
    print(f"{'case':<22} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} {'p50 overhead ms':>16}")
    for name, row in summary.items():
        print(
            f"{name:<22} {row['p50_ms']:>8.1f} {row['p90_ms']:>8.1f} {row['max_ms']:>8.1f} "
            f"{row['p50_overhead_ms']:>16.1f}"
        )
    print(f"the spec's hooks run alone (gpunode-cdi-hook, p50 of {args.hook_rounds}, ms): ", end="")
    print(", ".join(f"{name} {ms:.1f}" for name, ms in hooks.items()) + f"; sum {sum(hooks.values()):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
