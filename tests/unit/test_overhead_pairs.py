"""bench.overhead_pairs hands everything after ``--`` to bench.overhead, and keeps the rest."""

from __future__ import annotations

from bench.overhead_pairs import _parse


def test_arguments_after_the_separator_go_to_the_benchmark() -> None:
    opts, bench = _parse(["--pairs", "2", "abc123", "HEAD", "--", "--paths", "", "--rounds", "3"])
    assert (opts.before, opts.after, opts.pairs) == ("abc123", "HEAD", 2)
    assert bench == ["--paths", "", "--rounds", "3"]


def test_without_a_separator_the_benchmark_gets_its_defaults() -> None:
    opts, bench = _parse(["a", "b"])
    assert (opts.before, opts.after, opts.pairs) == ("a", "b", 3)
    assert bench == []
