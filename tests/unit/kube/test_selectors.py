"""Label selectors: the one parser (the drain's DRAIN_POD_SELECTOR_LABEL and the test API server)."""

from __future__ import annotations

import pytest

from gpunode.kube.selectors import LabelSelector


# -- label selectors (DRAIN_POD_SELECTOR_LABEL) ------------------------------------------------------------
@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("app=web", {"app": "web"}, True),
        ("app=web", {"app": "db"}, False),
        ("app=web", {}, False),
        ("app==web", {"app": "web"}, True),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("tier in (a, b)", {"tier": "b"}, True),
        ("tier in (a,b)", {}, False),
        ("tier notin (a,b)", {"tier": "c"}, True),
        ("tier notin (a,b)", {}, True),
        ("drainable", {"drainable": ""}, True),
        ("drainable", {}, False),
        ("!keep", {"keep": "x"}, False),
        ("!keep", {}, True),
        ("example.com/drain=yes,tier in (x,y),!keep", {"example.com/drain": "yes", "tier": "y"}, True),
        ("example.com/drain=yes,tier in (x,y),!keep", {"example.com/drain": "yes", "tier": "z"}, False),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.parse(selector).matches(labels) is matches


@pytest.mark.parametrize("selector", ["a=b,", "a in (x", "a in ()", "=b", "a=b=c", "!", "bad key", "a)"])
def test_bad_label_selectors_are_refused(selector: str) -> None:
    with pytest.raises(ValueError, match="label selector"):
        LabelSelector.parse(selector)


# -- the same parser, as the test API server reads ?labelSelector= (with the integer compares) --------------
LABEL_CASES = [
    ("empty selects all", "", {}, True),
    ("equal", "a=b", {"a": "b"}, True),
    ("double equal", "a==b", {"a": "b"}, True),
    ("equal other value", "a=b", {"a": "c"}, False),
    ("equal absent", "a=b", {}, False),
    ("not equal absent", "a!=b", {}, True),
    ("not equal same", "a!=b", {"a": "b"}, False),
    ("exists", "a", {"a": ""}, True),
    ("exists absent", "a", {}, False),
    ("not exists", "!a", {}, True),
    ("not exists present", "!a", {"a": "x"}, False),
    ("in", "a in (x, y)", {"a": "y"}, True),
    ("in absent", "a in (x,y)", {}, False),
    ("notin absent", "a notin (x,y)", {}, True),
    ("notin listed", "a notin (x,y)", {"a": "x"}, False),
    ("and all hold", "a=b,c in (d,e),!f", {"a": "b", "c": "e"}, True),
    ("and one fails", "a=b,c in (d,e),!f", {"a": "b", "c": "e", "f": "1"}, False),
    ("prefixed key", "nvidia.com/gpu.present=true", {"nvidia.com/gpu.present": "true"}, True),
    (
        "prefixed not equal",
        "nvidia.com/gpu.deploy.operands!=false",
        {"nvidia.com/gpu.deploy.operands": "false"},
        False,
    ),
    ("greater than", "count>2", {"count": "3"}, True),
    ("empty value", "a=", {"a": ""}, True),
]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"), [c[1:] for c in LABEL_CASES], ids=[c[0] for c in LABEL_CASES]
)
def test_label_selectors_as_the_api_server_reads_them(
    selector: str, labels: dict[str, str], expected: bool
) -> None:
    assert LabelSelector.parse(selector).matches(labels) is expected


@pytest.mark.parametrize("selector", ["a in (x", "a=b,", "=b", "a in ()", "a b", "a>x", "a=(b)", "a notin x"])
def test_bad_label_selectors_are_refused_by_the_api_server(selector: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the parser raises plain ValueError
        LabelSelector.parse(selector)


def test_the_drain_selector_keeps_refusing_integer_compares() -> None:
    """DRAIN_POD_SELECTOR_LABEL has never accepted > / <; numeric=False keeps it so, with the same error."""
    assert LabelSelector.parse("a>1").matches({"a": "2"}) is True
    with pytest.raises(ValueError, match="invalid label key 'a>1' in label selector term 'a>1'"):
        LabelSelector.parse("a>1", numeric=False)
