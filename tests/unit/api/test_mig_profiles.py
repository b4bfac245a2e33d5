"""The MIG profile-name grammar (`gpunode.api.mig_profiles`) against shared/reference/mig.md §1.3-1.4."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode.api.mig_profiles import MigProfileName, ProfileSyntaxError, parse_profile

# -- parse_profile: accepted strings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1g.5gb", MigProfileName(g=1, gb=5, c=1), id="1g.5gb"),
        pytest.param("1g.5gb+me", MigProfileName(g=1, gb=5, c=1, attrs=("me",)), id="1g.5gb+me"),
        pytest.param("1c.3g.20gb", MigProfileName(g=3, gb=20, c=1), id="1c.3g.20gb"),
        pytest.param("2c.4g.20gb", MigProfileName(g=4, gb=20, c=2), id="2c.4g.20gb"),
        pytest.param(
            "1g.24gb+me.all", MigProfileName(g=1, gb=24, c=1, attrs=("me.all",)), id="1g.24gb+me.all"
        ),
        pytest.param("2g.48gb-me", MigProfileName(g=2, gb=48, c=2, negative=("me",)), id="2g.48gb-me"),
        pytest.param("4g.96gb+gfx", MigProfileName(g=4, gb=96, c=4, attrs=("gfx",)), id="4g.96gb+gfx"),
        pytest.param("7g.40gb", MigProfileName(g=7, gb=40, c=7), id="7g.40gb"),
        pytest.param("7g.141gb", MigProfileName(g=7, gb=141, c=7), id="7g.141gb-three-digit-gb"),
        pytest.param("4c.7g.80gb", MigProfileName(g=7, gb=80, c=4), id="4c.7g.80gb"),
        pytest.param("1c.1g.5gb", MigProfileName(g=1, gb=5, c=1), id="explicit-c-equal-g"),
        pytest.param(
            "1g.24gb+me,gfx", MigProfileName(g=1, gb=24, c=1, attrs=("gfx", "me")), id="two-attributes"
        ),
        pytest.param(
            "1g.24gb+gfx,me", MigProfileName(g=1, gb=24, c=1, attrs=("gfx", "me")), id="attribute-order-free"
        ),
        pytest.param("1g.5gb+m2", MigProfileName(g=1, gb=5, c=1, attrs=("m2",)), id="attribute-with-digit"),
    ],
)
def test_parse_profile_accepts(text: str, expected: MigProfileName) -> None:
    assert parse_profile(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("3c.2g.10gb", id="c-greater-than-g"),
        pytest.param("1g.5gb+me,me", id="repeated-attribute"),
        pytest.param("1g.5gb+1x", id="attribute-starts-with-digit"),
        pytest.param("1g", id="no-memory"),
        pytest.param("g.5gb", id="no-g-count"),
        pytest.param("1g.5gb+me-x", id="plus-and-minus-mixed"),
        pytest.param("1g.5gb-me+gfx", id="minus-then-plus"),
        pytest.param("1g.5gb+", id="empty-attribute-list"),
        pytest.param("1g.5gb+me,", id="empty-trailing-attribute"),
        pytest.param("1g.5gb+.me", id="attribute-starts-with-dot"),
        pytest.param("1g.5gb+me.", id="attribute-ends-with-dot"),
        pytest.param("1g.5gb+m_e", id="attribute-not-alphanumeric"),
        pytest.param("0g.5gb", id="zero-g"),
        pytest.param("1g.0gb", id="zero-gb"),
        pytest.param("0c.1g.5gb", id="zero-c"),
        pytest.param("1g.5", id="no-gb-suffix"),
        pytest.param("1g5gb", id="no-dot"),
        pytest.param("1c.1c.3g.20gb", id="two-c-parts"),
        pytest.param("-1g.5gb", id="negative-g"),
        pytest.param("", id="empty"),
        pytest.param("all-1g.5gb", id="config-name-not-profile"),
    ],
)
def test_parse_profile_rejects(text: str) -> None:
    with pytest.raises(ProfileSyntaxError):
        parse_profile(text)


def test_profile_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="1g"):
        parse_profile("1g")


# -- str(): canonical form ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(t, id=t)
        for t in (
            "1g.5gb",
            "1g.5gb+me",
            "1c.3g.20gb",
            "2c.4g.20gb",
            "1g.24gb+me.all",
            "2g.48gb-me",
            "4g.96gb+gfx",
            "7g.141gb",
            "3c.7g.40gb",
            "1g.24gb+gfx,me",
        )
    ],
)
def test_str_round_trips_canonical_names(text: str) -> None:
    assert str(parse_profile(text)) == text


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param("1c.1g.5gb", "1g.5gb", id="c-equal-g-dropped"),
        pytest.param("7c.7g.40gb", "7g.40gb", id="full-ci-dropped"),
        pytest.param("1g.24gb+me,gfx", "1g.24gb+gfx,me", id="attributes-sorted"),
    ],
)
def test_str_is_canonical(text: str, canonical: str) -> None:
    assert str(parse_profile(text)) == canonical
    assert parse_profile(text) == parse_profile(canonical)


@pytest.mark.parametrize(
    ("text", "gi_name"),
    [
        pytest.param("1c.3g.20gb", "3g.20gb", id="1c.3g.20gb"),
        pytest.param("2c.7g.80gb", "7g.80gb", id="2c.7g.80gb"),
        pytest.param("1g.5gb+me", "1g.5gb+me", id="1g.5gb+me"),
        pytest.param("1c.2g.48gb-me", "2g.48gb-me", id="1c.2g.48gb-me"),
    ],
)
def test_gi_name_drops_the_ci_part(text: str, gi_name: str) -> None:
    assert parse_profile(text).gi_name == gi_name


# -- property: parse(str(x)) == x --------------------------------------------------------------------------

_attr = st.from_regex(r"\A[A-Za-z][A-Za-z0-9.]{0,5}\Z").filter(lambda s: not s.endswith("."))
_attr_set = st.lists(_attr, unique=True, max_size=3).map(lambda xs: tuple(sorted(xs)))


@st.composite
def profile_names(draw: st.DrawFn) -> MigProfileName:
    g = draw(st.integers(min_value=1, max_value=8))
    c = draw(st.integers(min_value=1, max_value=g))
    gb = draw(st.integers(min_value=1, max_value=2000))
    attrs = draw(_attr_set)
    negative: tuple[str, ...] = ()
    if not attrs:
        negative = draw(_attr_set)
    return MigProfileName(g=g, gb=gb, c=c, attrs=attrs, negative=negative)


@given(profile_names())
def test_parse_of_str_round_trips(name: MigProfileName) -> None:
    assert parse_profile(str(name)) == name
