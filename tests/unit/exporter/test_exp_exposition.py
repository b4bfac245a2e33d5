"""The text format's counter typing: dcgm-exporter's exact names with `# TYPE <name> counter`; the fast
renderer of the GPU series, byte for byte what prometheus_client's encoders write; a scrape's answer."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from gpunode.exporter import service
from gpunode.exporter.catalog import CATALOG
from gpunode.exporter.collector import ExporterCollector, Options, type_counters
from gpunode.exporter.counters import parse_counters
from gpunode.exporter.exposition import OPENMETRICS, TEXT, Unsupported, fast_encoder, render
from gpunode.exporter.sampler import Sampler, Snapshot
from gpunode.exporter.service import Exporter, ExporterOptions
from gpunode.nvml import mig
from gpunode.nvml.api import Nvml
from gpunode.nvml.real import RealNvml
from gpunode.sim import nvml as sim


def test_named_untyped_families_become_counters() -> None:
    text = (
        b'# HELP A_ENERGY energy\n# TYPE A_ENERGY untyped\nA_ENERGY{gpu="0"} 5.0\n'
        b'# HELP B_OTHER other\n# TYPE B_OTHER untyped\nB_OTHER{gpu="0"} 1.0\n'
        b'# HELP C_TEMP temp\n# TYPE C_TEMP gauge\nC_TEMP{gpu="0"} 30.0\n'
    )
    out = type_counters(text, ("A_ENERGY", "C_TEMP"))
    assert b'# TYPE A_ENERGY counter\nA_ENERGY{gpu="0"} 5.0\n' in out
    assert b"# TYPE B_OTHER untyped\n" in out  # not a counter of the file
    assert b"# TYPE C_TEMP gauge\n" in out  # only untyped lines change
    assert b"_total" not in out


def test_a_name_that_prefixes_another_is_not_confused() -> None:
    text = b"# TYPE A_X_TOTAL untyped\nA_X_TOTAL 1.0\n# TYPE A_X untyped\nA_X 2.0\n"
    out = type_counters(text, ("A_X",))
    assert out == b"# TYPE A_X_TOTAL untyped\nA_X_TOTAL 1.0\n# TYPE A_X counter\nA_X 2.0\n"


def test_no_counters_no_change() -> None:
    text = b"# TYPE A untyped\nA 1.0\n"
    assert type_counters(text, ()) is text


# -- the fast renderer (gpunode.exporter.exposition): byte for byte what prometheus_client writes ----------


def _slow(registry: CollectorRegistry, accept: str, counters: tuple[str, ...]) -> bytes:
    encoder, _ = choose_encoder(accept)
    text = encoder(registry)
    return text[: -len(b"# EOF\n")] if text.endswith(b"# EOF\n") else type_counters(text, counters)


class _Families:
    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _registry(*families: Metric) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(*families))
    return registry


def _fast(registry: CollectorRegistry, accept: str, counters: tuple[str, ...] = ()) -> bytes:
    fmt = fast_encoder(choose_encoder(accept)[0])
    assert fmt is not None, accept
    return render(registry, fmt, counters)


async def _every_field_snapshot() -> tuple[ExporterCollector, Snapshot]:
    """A dgx-h100 with GPU 0 split into 7 MIG devices, every catalog field enabled, a pod on GPU 1."""
    lib = sim.install("dgx-h100")
    with lib.node.mutate() as st:
        st.set_mig_mode(0, 1)
        st.reset_gpu(0)
        for _ in range(7):
            ret, gi = st.create_gi(0, mig.GI_1_SLICE, None)
            assert ret == 0
            assert st.create_ci(0, gi, mig.CI_1_SLICE, None)[0] == 0
    nvml = await RealNvml.open()
    try:
        sampler = Sampler(nvml, interval=1.0)
        await sampler.sample()
        snap = await sampler.sample()  # GPM needs a window
    finally:
        await nvml.close()
        sim.uninstall()
    text = "\n".join(
        f"{s.name}, {s.kind}, {s.help}"
        for s in CATALOG.values()
        if s.name != "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    )
    counters = parse_counters(text, "<every field>")
    # a label value that needs escaping, as a real product string could
    info = replace(snap.gpus[2].info, name='H100 "SXM" \\ test\nline')
    snap = replace(snap, gpus=(*snap.gpus[:2], replace(snap.gpus[2], info=info), *snap.gpus[3:]))
    return ExporterCollector(counters, Options("node-a"), lambda: snap), snap


ACCEPTS = ("", "text/plain", "application/openmetrics-text; version=1.0.0", "application/openmetrics-text")


@pytest.mark.parametrize("accept", ACCEPTS)
def test_every_field_on_h100_with_mig_renders_as_prometheus_client(accept: str) -> None:
    collector, snap = asyncio.run(_every_field_snapshot())
    assert sum(len(g.migs) for g in snap.gpus) == 7
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    fast = _fast(registry, accept, collector.counter_names)
    assert fast == _slow(registry, accept, collector.counter_names)
    assert b"DCGM_FI_PROF_SM_ACTIVE{" in fast
    assert b'GPU_I_PROFILE="1g.' in fast
    assert b'modelName="H100 \\"SXM\\" \\\\ test\\nline"' in fast


def _edge_families() -> tuple[Metric, ...]:
    gauge = Metric("G_ONE", 'help with \\ backslash, "quotes" and\na newline', "gauge")
    for value in (0.0, -0.0, 1.0, -1.5, 1e22, 123456789.0, 1234567.5, 0.1, math.inf, -math.inf, math.nan, 7):
        gauge.add_sample("G_ONE", {"z": "last", "a": "first", "m": f"v{value!r}"}, value)
    gauge.add_sample("G_ONE", {}, 2.0)
    gauge.add_sample("G_ONE", {"a": 'q"uo\\te\nnl ünï'}, 3.0)
    gauge.add_sample("G_ONE", {"a": 'q"uo\\te\nnl ünï'}, -0.0)  # the same label set again
    untyped = Metric("U_TWO", "a counter of the file", "unknown")
    untyped.add_sample("U_TWO", {"gpu": "0"}, 5.0)
    other = Metric("_U3", "untyped, not a counter", "unknown")
    other.add_sample("_U3", {"_x": "1", "x1": ""}, 0.0)
    empty = Metric("E_FOUR", "no samples", "gauge")
    return gauge, untyped, other, empty


@pytest.mark.parametrize("accept", ACCEPTS)
def test_escaping_numbers_and_types_as_prometheus_client(accept: str) -> None:
    registry = _registry(*_edge_families())
    fast = _fast(registry, accept, ("U_TWO", "G_ONE"))
    assert fast == _slow(registry, accept, ("U_TWO", "G_ONE"))
    for number in (b"-0.0", b"0.0", b"NaN", b"+Inf", b"-Inf", b"1e+22", b"1.23456789e+08", b"7.0"):
        assert b" " + number + b"\n" in fast


def _with_timestamp() -> Metric:
    metric = Metric("T_ONE", "x", "gauge")
    metric.add_sample("T_ONE", {}, 1.0, timestamp=5)
    return metric


def _other_sample_name() -> Metric:
    metric = Metric("S_ONE", "x", "gauge")
    metric.add_sample("S_ONE_created", {}, 1.0)
    return metric


def _one(name: str, kind: str, labels: dict[str, str], unit: str = "") -> Metric:
    metric = Metric(name, "x", kind, unit)
    metric.add_sample(name, labels, 1.0)
    return metric


@pytest.mark.parametrize(
    "family",
    [
        _one("C_ONE", "counter", {}),
        _one("A:B", "gauge", {}),
        _one("G_ONE", "gauge", {"__reserved": "x"}),
        _one("G_ONE", "gauge", {"a-b": "x"}),
        _one("G_SECONDS", "gauge", {}, unit="seconds"),
        _with_timestamp(),
        _other_sample_name(),
    ],
    ids=["counter", "colon", "reserved-label", "bad-label", "unit", "timestamp", "other-sample"],
)
def test_other_shapes_are_left_to_prometheus_client(family: Metric) -> None:
    with pytest.raises(Unsupported):
        render(_registry(family), TEXT)


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        ("", TEXT),
        ("text/plain; version=0.0.4", TEXT),
        ("application/openmetrics-text; version=1.0.0", OPENMETRICS),
        ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", OPENMETRICS),
        ("application/openmetrics-text; version=1.0.0; escaping=allow-utf-8", None),
        ("application/openmetrics-text; version=1.0.0; escaping=dots", None),
        ("application/openmetrics-text; version=2.0.0", None),
        ("text/plain; version=1.0.0; escaping=underscores", None),
    ],
)
def test_fast_formats_are_the_default_ones(accept: str, fmt: str | None) -> None:
    assert fast_encoder(choose_encoder(accept)[0]) == fmt


@pytest.mark.parametrize(
    "accept",
    [
        *ACCEPTS,
        "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
        "application/openmetrics-text; version=1.0.0; escaping=dots",
        "text/plain; version=1.0.0; escaping=values",
    ],
)
def test_a_scrape_answers_the_gpu_series_as_prometheus_client_then_the_self_metrics(
    accept: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "SELF_METRICS_MAX_AGE", 3600.0)  # however slow the machine, no expiry here
    every, snap = asyncio.run(_every_field_snapshot())
    exporter = Exporter(ExporterOptions("127.0.0.1", 0, 1.0, (), None), _no_nvml)
    exporter.collector = collector = ExporterCollector(
        every.values + every.label_fields, every.options, exporter.latest
    )
    exporter.gpu_registry.register(collector)
    exporter.sampler = cast(Sampler, SimpleNamespace(latest=snap))
    body, content_type = exporter.render(accept)
    encoder, expected_type = choose_encoder(accept)
    gpu = _slow(exporter.gpu_registry, accept, collector.counter_names)
    assert content_type == expected_type
    assert body.startswith(gpu)
    assert b"exporter_" in body[len(gpu) :].replace(b"__", b"_")  # the self-metrics follow
    assert body.endswith(b"# EOF\n") == ("openmetrics" in content_type)
    assert body.count(b"# EOF\n") <= 1
    # a new snapshot is answered when it is sampled (default formats); the next scrape answers it
    later = replace(snap, taken_at=snap.taken_at + 1, xids={3: 79})
    exporter.sampler = cast(Sampler, SimpleNamespace(latest=later))
    exporter._sampled(later)
    default = fast_encoder(encoder) is not None  # the formats made right after each sample
    assert (exporter._cache[content_type][0] == later.taken_at) == default
    ready = exporter._cache[content_type]
    body = exporter.render(accept)[0]
    assert (body is ready[2]) == default  # the others are made by the scrape, as before
    assert b'err_code="79"' in body.replace(b"__", b"_")
    assert body.startswith(_slow(exporter.gpu_registry, accept, collector.counter_names))


async def _no_nvml() -> Nvml:
    raise AssertionError("not opened in this test")


def test_many_accept_versions_keep_a_bounded_number_of_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client can name any OpenMetrics version >= 1.0.0 in its Accept header: each is its own content
    type. The answers kept stay few, and only the default formats are made after every sample."""
    monkeypatch.setattr(service, "SELF_METRICS_MAX_AGE", 3600.0)
    every, snap = asyncio.run(_every_field_snapshot())
    exporter = Exporter(ExporterOptions("127.0.0.1", 0, 1.0, (), None), _no_nvml)
    exporter.collector = ExporterCollector(every.values + every.label_fields, every.options, exporter.latest)
    exporter.gpu_registry.register(exporter.collector)
    exporter.sampler = cast(Sampler, SimpleNamespace(latest=snap))
    exporter.render("")
    exporter.render("application/openmetrics-text; version=1.0.0")
    for minor in range(40):
        body, content_type = exporter.render(f"application/openmetrics-text; version=1.{minor}.7")
        assert f"version=1.{minor}.7" in content_type
        assert body.endswith(b"# EOF\n")
    assert len(exporter._cache) <= service.MAX_FORMATS
    assert len(exporter._gpu_cache) <= service.MAX_FORMATS
    assert sorted(exporter._encoders) == sorted(
        [choose_encoder("")[1], choose_encoder("application/openmetrics-text; version=1.0.0")[1]]
    )
    later = replace(snap, taken_at=snap.taken_at + 1)
    exporter.sampler = cast(Sampler, SimpleNamespace(latest=later))
    exporter._sampled(later)
    assert {ct for ct, (taken, _, _) in exporter._cache.items() if taken == later.taken_at} == set(
        exporter._encoders
    )
    body, _ = exporter.render("")
    assert body is exporter._cache[choose_encoder("")[1]][2]
