"""Renders docs/configuration.md from the Settings fields, so the page cannot drift.

Regenerate with ``python -m cpersona.config --markdown > docs/configuration.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from cpersona.config import LEFT_OUT, SECTIONS, Rule, Settings, env_name, field_kind, field_rule

INTRO = """\
# Configuration

cpersona is configured only through environment variables, read once when the
server starts; there is no configuration file and no `.env` lookup. Every
variable has a working default, so an empty environment gives a stdio server
keeping its memories in `data/cpersona.db` (relative to the working directory,
so set an absolute path for real use).

How values are read:

- An empty value means "not set": the default applies.
- Booleans accept `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off` in any case,
  with surrounding spaces ignored. Choices (enums) ignore case and spaces too.
- A value that cannot be read stops start-up with a one-line error naming the
  variable and what it accepts. A number outside its range is clamped, reset
  to the default or refused; the Meaning column says which.
- The embedding variables also answer to generic names (`EMBEDDING_MODE`,
  `EMBEDDING_HTTP_URL`, `EMBEDDING_MODEL`, `EMBEDDING_API_KEY`,
  `EMBEDDING_API_URL`). When both spellings are set the `CPERSONA_` one wins;
  an empty `CPERSONA_` value counts as unset.
- A path setting (type `path`) may start with `~`, which is your home
  directory, as in a shell; MCP clients pass values unexpanded, so
  `"CPERSONA_DB_PATH": "~/.cpersona/memory.db"` in a client configuration
  works. Other shell syntax (`$HOME`) is not expanded.
- A `CPERSONA_` variable that is not a setting below is reported at start-up
  on stderr, once, with the nearest setting's name
  (`CPERSONA_EMBEDING_MODE is not a cpersona setting and is ignored; did you
  mean CPERSONA_EMBEDDING_MODE?`); it is otherwise ignored.
- `CPERSONA_EMBEDDING_MODE=http` without `CPERSONA_EMBEDDING_URL`, and `api`
  without `CPERSONA_EMBEDDING_API_KEY`, stop start-up (exit 2) with one line
  naming the variable to set.

This page is generated from `cpersona/config.py`; edit the field descriptions
there and regenerate with `python -m cpersona.config --markdown`.
"""


def _code(text: str) -> str:
    return f"`{text}`"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _type(kind: str, rule: Rule) -> str:
    name = {"secret": "str (secret)", "list": "list", "enum": "enum"}.get(kind, kind)
    if rule.only_true_word:
        return "bool (`true` only)"
    if rule.lo is not None and rule.hi is not None:
        return f"{name} {_num(rule.lo)}..{_num(rule.hi)}"
    if rule.lo is not None:
        return f"{name} ≥ {_num(rule.lo)}"
    return name


def _default(info: FieldInfo, rule: Rule) -> str:
    if rule.shown is not None:
        return rule.shown
    value: Any = info.default
    if value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Path | str):
        return _code(str(value))
    return _code(repr(value))


def _range_note(rule: Rule) -> str:
    if rule.lo is None and rule.hi is None:
        return ""
    if rule.lo is not None and rule.hi is not None:
        span = f"outside {_num(rule.lo)}..{_num(rule.hi)}"
    elif rule.lo is not None:
        span = f"below {_num(rule.lo)}"
    else:
        span = f"above {_num(rule.hi)}"  # type: ignore[arg-type]
    if rule.out_of_range == "error":
        return f" Values {span} stop start-up."
    if rule.out_of_range == "default":
        return f" Values {span} fall back to the default."
    if rule.hi is None:
        return f" Values {span} are raised to {_num(rule.lo)}."  # type: ignore[arg-type]
    return f" Values {span} are clamped into that range."


def _row(name: str, info: FieldInfo) -> str:
    rule = field_rule(info)
    kind, choices = field_kind(info)
    var = _code(env_name(name))
    if rule.alias:
        var += f" (alias {_code(rule.alias)})"
    meaning = (info.description or "").strip()
    if kind == "enum":
        meaning += " One of " + ", ".join(_code(c) for c in choices) + "."
    meaning += _range_note(rule)
    cells = [var, _type(kind, rule), _default(info, rule), meaning]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def settings_markdown() -> str:
    """The whole of docs/configuration.md as it should read now."""
    parts = [INTRO]
    fields = Settings.model_fields
    for key, title in SECTIONS.items():
        rows = [
            _row(name, info)
            for name, info in fields.items()
            if field_rule(info).section == key or key in field_rule(info).also
        ]
        parts.append(f"\n## {title}\n\n| Variable | Type | Default | Meaning |\n|---|---|---|---|\n")
        parts.append("\n".join(rows) + "\n")
    parts.append(
        "\n## Not read by cpersona\n\n"
        "These CPersona 2.6 variables belong to features cpersona does not have; "
        "setting them changes nothing: " + ", ".join(_code(v) for v in LEFT_OUT) + ".\n"
    )
    return "".join(parts)


if __name__ == "__main__":
    import sys

    sys.stdout.write(settings_markdown())
