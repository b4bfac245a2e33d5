"""Renders the latest snapshot as dcgm-exporter's metric families (a prometheus_client collector).

Names, help text and labels are dcgm-exporter's, so dashboards keep working. Its counters are named
without `_total` (e.g. DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION), and prometheus_client would rename a counter
family, so the families are built as untyped and :func:`type_counters` turns the text format's
``# TYPE <name> untyped`` into ``# TYPE <name> counter`` for the counters file's counters: exactly
dcgm-exporter's text. OpenMetrics requires a counter's samples to end in ``_total``; there the counters
stay ``unknown`` so that every series keeps dcgm-exporter's name. Nothing here calls NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpunode.exporter.catalog import MetricSpec
from gpunode.exporter.counters import Counter
from gpunode.exporter.podresources import PodRef
from gpunode.exporter.sampler import GpuSample, MigSample, Snapshot
from gpunode.nvml.xids import xid_message

HEALTH = "gpunode_gpu_health"
SHARE = "gpunode_mig_instance_sm_share"
APPROXIMATE = frozenset({"pcie_tx_bytes", "pcie_rx_bytes"})


@dataclass(frozen=True)
class Options:
    hostname: str | None
    virtual_gpus: bool = False  # KUBERNETES_VIRTUAL_GPUS: one series per sharing pod, with `vgpu`
    old_namespace: bool = False  # DCGM_EXPORTER_USE_OLD_NAMESPACE: the GPU UUID label is `uuid`


def _telemetry_value(spec: MetricSpec, gpu: GpuSample) -> float | None:
    tm = gpu.telemetry
    if tm is None or spec.source is None:
        return None
    source = spec.source
    if source in ("pcie_tx_bytes", "pcie_rx_bytes"):
        kbs = tm.pcie_tx_kbs if source == "pcie_tx_bytes" else tm.pcie_rx_kbs
        return None if kbs is None else kbs * 1024.0
    if source.startswith("gpm_"):  # NVML GPM percentages; dcgm-exporter's PROF values are ratios
        pct = gpu.gpm.get(source[4:]) if gpu.gpm else None
        return None if pct is None else pct / 100.0
    if source == "memory_total_mib":
        return float(gpu.info.memory_total_mib)
    value = getattr(tm, source, None)
    if value is None or isinstance(value, tuple):
        return None
    return float(value)


def _mig_value(spec: MetricSpec, mig: MigSample) -> float | None:
    source = spec.source or ""
    if "free" in source:
        return None if mig.memory_free_mib is None else float(mig.memory_free_mib)
    if "used" in source:
        return None if mig.memory_used_mib is None else float(mig.memory_used_mib)
    if source.endswith("memory_total_mib") or "total" in source:
        return float(mig.device.memory_mib)
    return None


def type_counters(text: bytes, names: Sequence[str]) -> bytes:
    """The text format (0.0.4) with each named family typed ``counter`` instead of ``untyped``."""
    for name in names:
        text = text.replace(f"# TYPE {name} untyped\n".encode(), f"# TYPE {name} counter\n".encode(), 1)
    return text


class ExporterCollector:
    def __init__(self, counters: Sequence[Counter], options: Options, latest: Callable[[], Snapshot]) -> None:
        self.values = [c for c in counters if c.kind != "label" and c.spec.source is not None]
        self.counter_names = tuple(c.spec.name for c in self.values if c.kind == "counter")
        self.label_fields = [c for c in counters if c.kind == "label" and c.spec.source is not None]
        self.options = options
        self.latest = latest

    def describe(self) -> list[Metric]:
        return []  # dynamic: families depend on the snapshot

    def _identity(self, snap: Snapshot, gpu: GpuSample) -> dict[str, str]:
        info = gpu.info
        labels = {
            "gpu": str(info.index),
            "uuid" if self.options.old_namespace else "UUID": info.uuid,
            "pci_bus_id": info.pci.bus_id,
            "device": f"nvidia{info.minor}",
            "modelName": info.name,
        }
        if self.options.hostname:
            labels["Hostname"] = self.options.hostname
        for counter in self.label_fields:  # string fields become labels on every series, as in dcgm-exporter
            value = {
                "driver_version": snap.driver_version,
                "nvml_version": snap.nvml_version,
                "brand": info.brand,
                "serial": info.serial or "",
                "vbios_version": info.vbios_version,
                "inforom_oem": info.inforom_oem,
                "inforom_ecc": info.inforom_ecc,
                "inforom_power": info.inforom_power,
                "inforom_image": info.inforom_image,
                "fabric_cluster_uuid": gpu.telemetry.fabric_cluster_uuid if gpu.telemetry else None,
            }.get(counter.spec.source or "")
            if value is not None:
                labels[counter.spec.name] = value
        return labels

    def _with_pods(self, base: dict[str, str], pods: Sequence[PodRef]) -> list[dict[str, str]]:
        if not pods:
            return [base]
        if not self.options.virtual_gpus:
            p = pods[0]
            return [{**base, "pod": p.pod, "namespace": p.namespace, "container": p.container}]
        out = []
        for p in pods:
            labels = {**base, "pod": p.pod, "namespace": p.namespace, "container": p.container}
            if p.vgpu is not None:
                labels["vgpu"] = p.vgpu
            out.append(labels)
        return out

    def collect(self) -> Iterator[Metric]:
        snap = self.latest()
        att = snap.attribution
        families: dict[str, Metric] = {}

        def family(counter: Counter) -> Metric:
            spec = counter.spec
            fam = families.get(spec.name)
            if fam is None:
                # the counters file's help text (dcgm-exporter's wording), except where our value is an
                # approximation: then the catalog's help, which says so
                text = spec.help if spec.source in APPROXIMATE else counter.help
                fam = Metric(spec.name, text, "gauge" if counter.kind == "gauge" else "unknown")
                families[spec.name] = fam
            return fam

        health = Metric(
            HEALTH, "1 while NVML answers for the GPU, 0 once it is lost (its identity stays).", "gauge"
        )
        share = Metric(
            SHARE,
            "The MIG instance's share of its GPU's SMs (NVML reports no utilisation per MIG instance).",
            "gauge",
        )
        for gpu in snap.gpus:
            base = self._identity(snap, gpu)
            health.add_sample(HEALTH, base, 1.0 if gpu.healthy else 0.0)
            pods = att.by_gpu_uuid.get(gpu.info.uuid, ()) if att is not None else ()
            gpu_labels = self._with_pods(base, pods)
            for mig in gpu.migs:
                if gpu.info.sm_count:
                    mig_base = {
                        **base,
                        "GPU_I_PROFILE": mig.device.profile,
                        "GPU_I_ID": str(mig.device.gi_id),
                    }
                    share.add_sample(SHARE, mig_base, mig.device.sm_count / gpu.info.sm_count)
            for counter in self.values:
                spec = counter.spec
                if spec.source == "xid":
                    xid = snap.xids.get(gpu.info.index, 0)
                    fam = family(counter)
                    for labels in gpu_labels:
                        fam.add_sample(
                            spec.name,
                            {**labels, "err_code": str(xid), "err_msg": xid_message(xid)},
                            float(xid),
                        )
                    continue
                if spec.per_mig and gpu.migs:
                    for mig in gpu.migs:
                        value = _mig_value(spec, mig)
                        if value is None:
                            continue
                        mig_base = {
                            **base,
                            "GPU_I_PROFILE": mig.device.profile,
                            "GPU_I_ID": str(mig.device.gi_id),
                        }
                        mig_pods = att.by_mig.get((gpu.info.index, mig.device.gi_id), ()) if att else ()
                        fam = family(counter)
                        for labels in self._with_pods(mig_base, mig_pods):
                            fam.add_sample(spec.name, labels, value)
                    continue
                value = _telemetry_value(spec, gpu)
                if value is None:
                    continue
                fam = family(counter)
                for labels in gpu_labels:
                    fam.add_sample(spec.name, labels, value)
        yield from families.values()
        yield health
        yield share
