"""Unit-test fixtures shared by more than one module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.tools import registry


@pytest.fixture
def isolated_registry() -> Iterator[None]:
    """The tool registry is process-global: put it back exactly as it was after the test."""
    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
