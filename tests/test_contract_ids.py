"""Every contract id the repository cites is defined once in docs/contracts/.

A definition is a list item opening with the bold id (``- **RC-3** [R] ...``).
A citation is any id-shaped token whose prefix docs/contracts uses, anywhere
in code, tests, benchmarks or docs, plus any id-shaped token on a line after
the word "spec" (so a citation with a mistyped prefix is caught too). Ranges
(``RX-9..RX-13``, ``EMB-1..7``, ``TQ-1 … TQ-3``) need both ends defined;
slash lists (``CLI-6/7``) need every member.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "docs" / "contracts"
SELF = Path(__file__).resolve()
SCANNED = ("cpersona", "tests", "bench", "docs", "migrations", "README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".ini", ".cfg", ".mako", ".yml", ".yaml"}
SKIPPED_DIRS = {".venv", ".venvs", "__pycache__", "fixtures", ".pytest_cache", "node_modules"}

DEFINITION = re.compile(r"^- \*\*([A-Z][A-Z0-9]*-\d+)\*\*", re.MULTILINE)
TOKEN = re.compile(r"\b([A-Z][A-Z0-9]*)-(\d+)\b")
RANGE = re.compile(r"\b([A-Z][A-Z0-9]*)-(\d+)\s*(?:\.\.|…|–)\s*(?:([A-Z][A-Z0-9]*)-)?(\d+)\b")
SLASHES = re.compile(r"\b([A-Z][A-Z0-9]*)-(\d+)((?:/\d+)+)\b")
SPEC_LINE = re.compile(r"\bspec\b(.*)", re.IGNORECASE)
# Id-shaped words that are standards or encodings, not contract points.
NOT_CONTRACTS = {"ISO-8601", "UTF-8", "UTF-16", "SHA-256", "IEEE-754"}
NOT_CONTRACT_PREFIXES = {"CVE", "UTF", "SHA", "IEEE", "RFC"}


def definitions() -> list[tuple[str, str]]:
    """(id, file name) for every definition, duplicates kept."""
    return [
        (ident, path.name)
        for path in sorted(CONTRACTS.glob("*.md"))
        for ident in DEFINITION.findall(path.read_text(encoding="utf-8"))
    ]


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            if (
                path.is_file()
                and path.suffix in SUFFIXES
                and path != SELF  # SELF plants bad ids
                and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
            ):
                yield path


def citations(text: str, prefixes: set[str]) -> Iterator[tuple[str, int]]:
    """Each cited id (ranges expanded to their ends, slash lists to members) with its line number."""
    for number, line in enumerate(text.splitlines(), 1):
        for cited in _cited_on(line, prefixes):
            yield cited, number


def _cited_on(line: str, prefixes: set[str]) -> Iterable[str]:
    found: set[str] = set()
    for first, start, second, end in RANGE.findall(line):
        found.update((f"{first}-{start}", f"{second or first}-{end}"))
        if (second or first) != first or int(end) <= int(start):
            found.add(f"{first}-{start}..{second or first}-{end} (not a range)")
    for prefix, number, rest in SLASHES.findall(line):
        found.update(f"{prefix}-{n}" for n in [number, *rest.strip("/").split("/")])
    spec_tail = SPEC_LINE.search(line)
    for match in TOKEN.finditer(line):
        ident, prefix = match.group(0), match.group(1)
        if ident in NOT_CONTRACTS or prefix in NOT_CONTRACT_PREFIXES:
            continue
        if prefix in prefixes or (spec_tail and match.start() >= spec_tail.start(1)):
            found.add(ident)
    return found


def test_every_cited_contract_id_is_defined() -> None:
    defined = {ident for ident, _ in definitions()}
    prefixes = {ident.rsplit("-", 1)[0] for ident in defined}
    dangling: list[str] = []
    count = 0
    for path in scanned_files():
        for cited, line in citations(path.read_text(encoding="utf-8", errors="replace"), prefixes):
            count += 1
            if cited not in defined:
                dangling.append(f"{path.relative_to(ROOT)}:{line}: {cited}")
    assert count > 500, f"only {count} citations found; is the scanner looking in the right place?"
    assert not dangling, "cited but not defined in docs/contracts/:\n" + "\n".join(dangling)


def test_no_contract_id_is_defined_twice() -> None:
    seen = Counter(ident for ident, _ in definitions())
    where: dict[str, list[str]] = {}
    for ident, name in definitions():
        where.setdefault(ident, []).append(name)
    assert len(seen) > 600, "docs/contracts/ should define every contract point of the specification"
    twice = {ident: where[ident] for ident, n in seen.items() if n > 1}
    assert not twice, f"defined more than once: {twice}"


def test_the_scanner_catches_typos_ranges_and_unknown_prefixes() -> None:
    # The checks above are only as good as the parser: pin what it must see.
    prefixes = {"RC", "RX", "EMB", "CLI"}
    text = (
        "# spec RC-3, RC-99\n"
        "see RX-9..RX-13 and EMB-1..7, TQ-1 … TQ-3\n"
        "x = 1  # spec QQ-4 and UTF-8 text\n"
        "CLI-6/7 matters; ISO-8601 does not; neither does ABC-1 outside a spec line\n"
    )
    found = {ident for ident, _ in citations(text, prefixes)}
    assert {"RC-3", "RC-99", "RX-9", "RX-13", "EMB-1", "EMB-7", "TQ-1", "TQ-3", "QQ-4", "CLI-6", "CLI-7"} <= found
    assert not {"UTF-8", "ISO-8601", "ABC-1", "RX-10"} & found
    assert "RX-13..RX-9 (not a range)" in {ident for ident, _ in citations("RX-13..RX-9", prefixes)}
