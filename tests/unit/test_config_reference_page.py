"""docs/configuration.md is what ``unstuck config reference`` renders from ``Settings``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from tests.harness import REPO
from workers.cli import config_reference
from workers.cli.config_reference import render_page, sections, undescribed_fields
from workers.cli.main import main

PAGE = REPO / "docs" / "configuration.md"


def test_the_checked_in_page_is_the_rendering_of_settings() -> None:
    # When the page is rendered from the model as it is now
    rendered = render_page()
    # Then the checked-in page is exactly that (regenerate: unstuck config reference > docs/configuration.md)
    assert PAGE.read_text(encoding="utf-8") == rendered


def test_every_setting_has_a_description_and_every_section_a_docstring() -> None:
    assert undescribed_fields() == []


def test_every_environment_variable_is_on_the_page() -> None:
    page = PAGE.read_text(encoding="utf-8")
    names = [row.env for section in sections() for row in section.rows if row.env]
    assert "UNSTUCK_LEASE__TTL_S" in names
    assert "UNSTUCK_AGENTS__DEFAULTS__LLM__IDLE_TIMEOUT_S" in names
    assert [name for name in names if f"`{name}`" not in page] == []


def test_rows_inside_a_json_value_have_no_variable_of_their_own() -> None:
    rows = {row.path: row for section in sections() for row in section.rows}
    assert rows["tools.breakers.<tool>.failures"].env is None
    assert rows["agents.list[].id"].env is None
    assert rows["tools.breakers"].env == "UNSTUCK_TOOLS__BREAKERS"


def test_a_field_without_a_description_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a settings model with one described field and one bare field
    class Probe(BaseModel):
        """A probe section."""

        told: int = Field(1, description="says what it is")
        bare: int = 2

    monkeypatch.setattr(config_reference, "Settings", Probe)
    # Then the bare one is named, and the page shows it with an empty meaning
    assert undescribed_fields() == ["bare"]
    assert "| `bare` | `UNSTUCK_BARE` | int | `2` |  |" in render_page()


def test_the_cli_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == render_page()
