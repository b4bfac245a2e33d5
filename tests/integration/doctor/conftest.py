"""The doctor's tests run on a healthy GPU node on disk (helpers.healthy_node), broken one way at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.healthy_node import Node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    built = Node(tmp_path)
    yield built
    built.close()
