"""Run a MIG command that SIGKILLs itself right after its N-th journalled step (the crash tests).

    python tests/helpers/mig_crash.py N gpunode-mig apply -f config.yaml -c split-3g ...
    python tests/helpers/mig_crash.py N gpunode-mig-manager --sim-state ...

The fault is installed through the applier's testing seam (``gpunode.mig.apply.install_step_hook``)
inside this process, then the command's own ``main`` runs with the remaining arguments: production
code has no way to turn it on (no environment variable, flag or file).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
COMMAND = [sys.executable, str(HERE)]  # + [str(N), "gpunode-mig" | "gpunode-mig-manager", *args]


def _killer(after: int) -> Callable[[int], None]:
    def kill(step: int) -> None:
        if step >= after:
            os.kill(os.getpid(), signal.SIGKILL)  # die right after this step, no cleanup

    return kill


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or argv[1] not in ("gpunode-mig", "gpunode-mig-manager"):
        print("usage: mig_crash.py N gpunode-mig|gpunode-mig-manager [args...]", file=sys.stderr)
        return 2
    from gpunode.mig import apply

    apply.install_step_hook(_killer(int(argv[0])))
    if argv[1] == "gpunode-mig":
        from gpunode.mig.cli import main as command
    else:
        from gpunode.mig.manager_cli import main as command
    sys.argv = [argv[1], *argv[2:]]
    return command(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
