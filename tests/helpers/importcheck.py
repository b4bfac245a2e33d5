"""Import modules in a fresh interpreter and check the import has no side effects."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterable

_PROBE = """
import builtins, logging, socket, sys
opened = []
real_open = builtins.open
def spy_open(file, *args, **kwargs):
    opened.append(str(file))
    return real_open(file, *args, **kwargs)
builtins.open = spy_open
class NoSockets(socket.socket):
    def __init__(self, *args, **kwargs):
        raise AssertionError("socket created at import time")
socket.socket = NoSockets
for name in {modules!r}:
    __import__(name)
builtins.open = real_open
assert "pynvml" not in sys.modules, "pynvml imported"
assert not [m for m in sys.modules if m.startswith("gpunode.nvml")], "gpunode.nvml imported"
assert logging.getLogger().handlers == [], "logging configured at import"
assert opened == [], opened
print("ok")
"""


def assert_import_is_inert(modules: Iterable[str]) -> None:
    """Importing ``modules`` opens no file, creates no socket, configures no logging and loads no NVML."""
    code = textwrap.dedent(_PROBE.format(modules=tuple(modules)))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
