"""The text format's counter typing: dcgm-exporter's exact names with `# TYPE <name> counter`."""

from __future__ import annotations

from gpunode.exporter.collector import type_counters


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
