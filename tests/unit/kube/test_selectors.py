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
