"""PEP 440 versions, as far as the update check needs them (spec admin-and-safety UP-3).

Ordering follows PEP 440: epoch, then the release numbers (trailing zeros do
not count: ``2.7 == 2.7.0``), then pre-releases (``a`` < ``b`` < ``rc``) before
the final, post-releases after it, and a dev release before everything it
qualifies. Local segments (``+local``) are ignored. A string that is not a
PEP 440 version parses to None and is skipped by callers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_PATTERN = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Version:
    text: str
    epoch: int
    release: tuple[int, ...]  # trailing zeros stripped
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None

    @property
    def key(self) -> tuple:
        # PEP 440 order; a bare dev release sorts before the pre-releases of its release.
        pre = (
            self.pre
            if self.pre is not None
            else ((-_INF, 0) if self.dev is not None and self.post is None else (_INF, 0))
        )
        return (
            self.epoch,
            self.release,
            pre,
            self.post if self.post is not None else -_INF,
            self.dev if self.dev is not None else _INF,
        )

    @property
    def is_pre(self) -> bool:
        """An alpha/beta/rc or dev release (never proposed as an update)."""
        return self.pre is not None or self.dev is not None

    @property
    def is_final(self) -> bool:
        return not self.is_pre

    def same_release_as(self, other: Version) -> bool:
        """Whether this is exactly the final of ``other`` (``2.7.0`` for ``2.7.0rc1``)."""
        return self.is_final and self.post is None and (self.epoch, self.release) == (other.epoch, other.release)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    def __hash__(self) -> int:
        return hash(self.key)


def parse_version(text: str) -> Version | None:
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    release = tuple(int(part) for part in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (_PRE_RANK[match["pre_l"].lower()], int(match["pre_n"] or 0)) if match["pre_l"] else None
    if match["post_n1"] is not None:
        post: int | None = int(match["post_n1"])
    elif match["post_l"]:
        post = int(match["post_n2"] or 0)
    else:
        post = None
    dev = int(match["dev_n"] or 0) if match["dev_l"] else None
    return Version(text, int(match["epoch"] or 0), release, pre, post, dev)
