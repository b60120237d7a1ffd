"""How one ``CPERSONA_*`` variable is named, spelled and read.

The settings table (:mod:`cpersona.config`) declares each field with
:func:`rule_field`; this module turns an environment value into that field's
type with the spec's spellings (CFG-2..CFG-5) and one-line errors, and feeds
the values to pydantic-settings through :class:`EnvironmentSource`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

ENV_PREFIX = "CPERSONA_"
BOOL_TRUE = ("true", "1", "yes", "on")
BOOL_FALSE = ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line fit for stderr."""


@dataclass(frozen=True)
class Rule:
    """How one field is read from the environment and which values it accepts.

    ``out_of_range`` says what a value outside ``lo``/``hi`` does: ``clamp`` to
    the bound, fall back to the ``default``, or stop start-up (``error``).
    ``shown`` is the default as documentation states it when it is derived
    from other settings.
    """

    section: str
    lo: float | None = None
    hi: float | None = None
    out_of_range: Literal["clamp", "default", "error"] = "clamp"
    alias: str | None = None
    shown: str | None = None
    empty_is_error: bool = False
    only_true_word: bool = False
    also: tuple[str, ...] = ()


def rule_field(default: Any, section: str, description: str, **rule: Any) -> Any:
    info = Field(default, description=description)
    info.metadata.append(Rule(section, **rule))
    return info


def field_rule(info: FieldInfo) -> Rule:
    for item in info.metadata:
        if isinstance(item, Rule):
            return item
    raise LookupError("field has no Rule")  # every Settings field is built by rule_field


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def field_kind(info: FieldInfo) -> tuple[str, tuple[str, ...]]:
    """The parsing kind of a field (and its choices, for enums)."""
    ann = info.annotation
    if get_origin(ann) in (Union, UnionType):
        ann = next(a for a in get_args(ann) if a is not NoneType)
    if get_origin(ann) is Literal:
        return "enum", tuple(get_args(ann))
    if get_origin(ann) is tuple:
        return "list", ()
    kinds = {bool: "bool", int: "int", float: "float", Path: "path", SecretStr: "secret", str: "str"}
    return kinds[ann], ()


def bad_value(var: str, raw: Any, expected: str) -> ConfigError:
    return ConfigError(f"{var}={str(raw)!r} is not valid: expected {expected}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def expectation(kind: str, rule: Rule) -> str:
    noun = "an integer" if kind == "int" else "a number"
    if rule.out_of_range != "error":
        return noun
    if rule.lo is not None and rule.hi is not None:
        return f"{noun} {_num(rule.lo)}..{_num(rule.hi)}"
    if rule.lo is not None:
        return f"{noun} >= {_num(rule.lo)}"
    if rule.hi is not None:
        return f"{noun} <= {_num(rule.hi)}"
    return noun


_INT = re.compile(r"[+-]?\d+")


def parse_value(var: str, raw: str, info: FieldInfo) -> Any:
    """Turn one trimmed, non-empty environment value into the field's type."""
    kind, choices = field_kind(info)
    rule = field_rule(info)
    if kind == "bool":
        word = raw.lower()
        if rule.only_true_word:
            # Spec CFG-3 / open point 2: only the word `true` opts in. The other
            # "true" spellings are refused rather than read as false, so nobody
            # believes they enabled something they did not.
            if word in BOOL_FALSE or word == "true":
                return word == "true"
            raise bad_value(var, raw, "true or false (only the word 'true' enables it)")
        if word in BOOL_TRUE:
            return True
        if word in BOOL_FALSE:
            return False
        raise bad_value(var, raw, "one of " + ", ".join(w for pair in zip(BOOL_TRUE, BOOL_FALSE) for w in pair))
    if kind == "enum":
        word = raw.lower()
        if word not in choices:
            raise bad_value(var, raw, "one of " + ", ".join(choices))
        return word
    if kind == "int":
        if not _INT.fullmatch(raw):
            raise bad_value(var, raw, expectation(kind, rule))
        return int(raw)
    if kind == "float":
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise bad_value(var, raw, expectation(kind, rule))
        return value
    if kind == "list":
        return tuple(part for part in re.split(r"[\s,]+", raw) if part)
    return raw  # str, secret and path: pydantic converts


def lookup(environ: Mapping[str, str], name: str, info: FieldInfo) -> tuple[str, str] | None:
    """The variable that supplies a field and its trimmed value, if any does."""
    rule = field_rule(info)
    for var in (env_name(name), rule.alias):
        if var is None or var not in environ:
            continue
        raw = environ[var].strip()
        if raw:
            return var, raw
        if rule.empty_is_error:
            raise ConfigError(f"{var} is set but empty: expected {_choices_text(info)}")
        # Spec CFG-5: an empty prefixed value counts as unset, so the alias is tried.
    return None


def _choices_text(info: FieldInfo) -> str:
    kind, choices = field_kind(info)
    return "one of " + ", ".join(choices) if kind == "enum" else "a value"


# The mapping load_settings() was given; None means the process environment.
ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("cpersona_environ", default=None)


class EnvironmentSource(PydanticBaseSettingsSource):
    """Reads CPERSONA_* variables with the project's own parsing rules.

    pydantic-settings' built-in env source accepts spellings the spec does not
    (``t``, ``y``), cannot treat an empty prefixed name as unset before trying
    its alias, and reports errors as multi-line ValidationErrors.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ does the whole job

    def __call__(self) -> dict[str, Any]:
        environ = ENVIRON.get()
        if environ is None:
            environ = os.environ
        values: dict[str, Any] = {}
        for name, info in self.settings_cls.model_fields.items():
            found = lookup(environ, name, info)
            if found is not None:
                values[name] = parse_value(found[0], found[1], info)
        return values
