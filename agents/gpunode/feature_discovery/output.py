"""Where the labels go: NFD's local-source feature file, or a NodeFeature object (NFD's NodeFeature API).

The feature file holds `key=value` lines, written atomically, only when something changed.

While the labeler runs the file carries no expiry, so labels never blink. When it stops, the labels stay
but gain a `# +expiry-time=` directive (NFD >= v0.14): a labeler that comes back in time rewrites the file
without it; one that never comes back has its labels expire instead of lingering forever. NVIDIA's GFD
deletes the file on every exit, so every restart makes the node lose its GPU labels (GFD issue #796).

The NodeFeature object ``nvidia-features-for-<node>`` carries the labels in ``spec.labels``; it is
created or updated only when the labels differ, owned (for garbage collection) by the DaemonSet and the
pod as NVIDIA's is, and never deleted on exit.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode.common.atomic import atomic_write

if TYPE_CHECKING:  # the Kubernetes client loads only when the NodeFeature API is in use
    from gpunode.kube.api import OwnerRef
    from gpunode.kube.client import Kube

DEFAULT_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
MAX_FILE_BYTES = 65536  # NFD ignores larger feature files


class OutputError(Exception):
    """The feature file could not be written (names the path and the reason)."""


def render(labels: Mapping[str, str], expiry: datetime | None = None) -> str:
    lines = []
    if expiry is not None:
        lines.append(f"# +expiry-time={expiry.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    lines += [f"{key}={labels[key]}" for key in sorted(labels)]
    return "".join(line + "\n" for line in lines)


def expiry_after_stop(interval: float, now: datetime | None = None, margin: float = 60.0) -> datetime:
    """When a stopped labeler's labels should go: two intervals and a margin from now."""
    start = now or datetime.now(UTC)
    return start + timedelta(seconds=2 * interval + margin)


NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"


class FeatureFile:
    """The output: a file (atomic replace, mode 0644) or, for path "", standard output."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.last: str | None = None

    def write(self, labels: Mapping[str, str], expiry: datetime | None = None) -> bool:
        """Write if the content differs from what is there; returns whether it wrote."""
        text = render(labels, expiry)
        size = len(text.encode())
        if size > MAX_FILE_BYTES:
            raise OutputError(f"{self.path}: {size} bytes of labels, over NFD's 64 KiB feature-file limit")
        if self.path is None:
            if text != self.last:
                sys.stdout.write(text)
                sys.stdout.flush()
                self.last = text
                return True
            return False
        try:
            written = atomic_write(self.path, text, mode=0o644, only_if_changed=True)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.last = text
        return written

    def delete(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def node_feature_name(node_name: str) -> str:
    return f"nvidia-features-for-{node_name}"


class NodeFeatureOutput:
    """The labels as NodeFeature ``nvidia-features-for-<node>`` in ``namespace``."""

    def __init__(self, kube: Kube, namespace: str, pod_name: str | None = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = node_feature_name(kube.node_name)
        self.pod_name = pod_name
        self.path = None  # nothing on disk to expire or delete on exit
        self._owners: tuple[OwnerRef, ...] | None = None
        self.owner_warning: str | None = None

    async def owners(self) -> tuple[OwnerRef, ...]:
        """The pod and the DaemonSet controlling it (NVIDIA's owners: the object goes when they do);
        none outside a pod. Looked up once; a failed lookup is a warning, not an error."""
        if self._owners is not None:
            return self._owners
        from gpunode.kube.api import KubeError, KubeUnavailable, OwnerRef

        if not self.pod_name:
            self._owners = ()
            return self._owners
        try:
            pod = await self.kube.get_pod(self.namespace, self.pod_name)
        except KubeUnavailable:
            return ()  # try again next pass
        except KubeError as exc:
            self.owner_warning = f"pod {self.namespace}/{self.pod_name}: {exc}"
            self._owners = ()
            return self._owners
        controllers = tuple(o for o in pod.owners if o.controller and o.kind == "DaemonSet")
        self._owners = (*controllers, OwnerRef("v1", "Pod", pod.name, pod.uid))
        return self._owners

    async def write(self, labels: Mapping[str, str]) -> bool:
        from gpunode.kube.api import KubeError

        try:
            outcome = await self.kube.put_node_feature(
                self.namespace,
                self.name,
                labels=labels,
                object_labels={NODE_NAME_LABEL: self.kube.node_name},
                owners=await self.owners(),
            )
        except KubeError as exc:
            raise OutputError(f"NodeFeature {self.namespace}/{self.name}: {exc}") from None
        return outcome != "unchanged"
