"""docs/configuration.md is generated from the Settings fields and must not drift from them."""

from __future__ import annotations

import re
from pathlib import Path

from cpersona.config import Settings, env_name
from cpersona.config_docs import settings_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_doc_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == settings_markdown(), (
        "docs/configuration.md is stale; regenerate it with "
        "`python -m cpersona.config --markdown > docs/configuration.md`"
    )


def test_every_setting_is_documented_once_per_section() -> None:
    text = settings_markdown()
    documented = re.findall(r"^\| `(CPERSONA_[A-Z0-9_]+)`", text, flags=re.MULTILINE)
    expected = {env_name(name) for name in Settings.model_fields}
    assert set(documented) == expected
    # Only the two corpus caps the spec also lists under §8.6 appear twice.
    twice = {v for v in documented if documented.count(v) > 1}
    assert twice == {"CPERSONA_VECTOR_INDEX_MAX_EXCLUDED_IDS", "CPERSONA_CALIBRATE_MAX_SAMPLE"}


def test_rows_show_aliases_defaults_and_choices() -> None:
    text = settings_markdown()
    assert "| `CPERSONA_EMBEDDING_MODE` (alias `EMBEDDING_MODE`) | enum | `none` |" in text
    assert "| `CPERSONA_EPISODE_PENALTY_ENABLED` | bool | `true` |" in text
    assert "| `CPERSONA_HTTP_PORT` | int 1..65535 | `8402` |" in text
    assert "One of `rrf`, `rsf`, `cascade`." in text
