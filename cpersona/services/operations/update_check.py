"""``check_update``: is a newer (or withdrawn) release of this server out there? (spec admin-and-safety §13)

One verdict per process, held in memory:

    process start  → background thread (nothing waits on it): the cached verdict
                     ``update-check.json`` beside the database when it is fresh and
                     was written for the running version, else one index fetch
    bare call      → the in-memory verdict only: no network, no disk (UP-5)
    refresh=true   → fetch now, within 3 s; a failure keeps the verdict known
    apply=true     → run the update command for pip / checkout installs, on
                     request only, one at a time, restart always required (UP-7)

The index is a PEP 691 JSON simple page. Which page is a deployment decision
(spec §15 item 8): ``CPERSONA_UPDATE_CHECK_URL`` names it, by default the page
of this distribution's name on pypi.org. A version the page does not list is
``unlisted`` (a development build), which is never announced.

Only releases of this program count. ``cpersona`` on PyPI is CPersona 2.6, a
different program: a page that names another project, and files of another
distribution on our page, are not ours. When the check cannot tell (index
unreachable, an answer that is not our project's page) the state stays
``unknown`` with ``unknown_reason`` saying why; nothing is announced.

``CPERSONA_UPDATE_CHECK=false`` turns every part off: no request, no cache file
read or written, and the tool answers ``state: "disabled"`` (UP-1).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cpersona import DISTRIBUTION, __version__
from cpersona.services.app import App
from cpersona.services.operations.install import Installation, detect_install, run_steps
from cpersona.services.operations.versions import Version, parse_version
from cpersona.services.requests import Request

log = logging.getLogger(__name__)

FETCH_BUDGET_SECONDS = 3.0  # UP-2, end to end
MAX_INDEX_BYTES = 1 << 20  # UP-2
REASON_MAX_CHARS = 200  # UP-3
ACCEPT = "application/vnd.pypi.simple.v1+json"
# Our release's own page (its description carries the changes); never the reference's repository.
RELEASE_NOTES = f"https://pypi.org/project/{DISTRIBUTION}/{{version}}/"
STATES = ("ok", "newer", "yanked", "unlisted", "unknown", "disabled")


@dataclass(frozen=True)
class Verdict:
    state: str
    running: str
    kind: str | None = None
    available: str | None = None
    reason: str | None = None


# -- deciding (UP-3) -----------------------------------------------------------------------------


def project_key(name: str) -> str:
    """PEP 503 normalized form: ``Cpersona_Server`` and ``cpersona-server`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


OURS = project_key(DISTRIBUTION)


def _file_version(filename: str) -> Version | None:
    """The version a distribution file of ours is for (wheels ``name-ver-…whl``, sdists ``name-ver.tar.gz``).

    A file of another distribution is None: a mirror's page or a renamed file must not pass
    another program's release off as ours.
    """
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parse_version(parts[1]) if len(parts) >= 5 and project_key(parts[0]) == OURS else None
    for suffix in (".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            if "-" not in stem:
                return None
            name, version = stem.rsplit("-", 1)
            return parse_version(version) if project_key(name) == OURS else None
    return None


def not_ours(document: Any) -> str | None:
    """Why an index document is not our project's page (a sentence), or None when it is."""
    if not isinstance(document, dict) or not isinstance(document.get("files", []), list):
        return "the index answered something that is not a PEP 691 project page"
    name = document.get("name")
    if not isinstance(name, str):
        return "the index page does not name its project"
    if project_key(name) != OURS:
        return (
            f"the index page is for the project {name[:100]!r}, not {DISTRIBUTION}; releases of another "
            "program are never offered"
        )
    return None


def _yank_text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()[:REASON_MAX_CHARS]
    return None


def decide(document: Any, running: str) -> Verdict | None:
    """The verdict an index document gives for ``running``; None when the document is not our usable page."""
    if not_ours(document) is not None:
        return None
    current = parse_version(running)
    if current is None:
        return None
    files: dict[Version, list[Any]] = {}
    for entry in document.get("files", []):
        if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
            version = _file_version(entry["filename"])
            if version is not None:
                files.setdefault(version, []).append(entry.get("yanked", False))
    listed = {v for raw in document.get("versions", []) if isinstance(raw, str) and (v := parse_version(raw))}
    listed |= set(files)
    if current not in listed:
        return Verdict("unlisted", running)

    def withdrawn(version: Version) -> bool:
        marks = files.get(version, [])
        return bool(marks) and all(mark is True or isinstance(mark, str) for mark in marks)

    finals = [v for v in listed if v.is_final and v > current and not withdrawn(v)]
    newest = max(finals) if finals else None
    available = newest.text if newest else None
    if withdrawn(current):
        reasons = [text for mark in files[current] if (text := _yank_text(mark))]
        return Verdict("yanked", running, "yanked", available, reasons[0] if reasons else None)
    if newest is not None:
        kind = "prerelease_final" if current.is_pre and newest.same_release_as(current) else "newer"
        return Verdict("newer", running, kind, available)
    return Verdict("ok", running)


# -- fetching (UP-2) -------------------------------------------------------------------------------


class IndexUnreadable(Exception):
    """The index page could not be had; the message says why, for ``unknown_reason``."""


def fetch_index(url: str, budget: float = FETCH_BUDGET_SECONDS) -> Any:
    """GET the index page within ``budget`` seconds and 1 MiB; the parsed JSON, or IndexUnreadable."""
    import httpx  # here: every recall imports this module for its notice, few ever fetch

    deadline = time.monotonic() + budget
    try:
        with httpx.Client(timeout=httpx.Timeout(budget), follow_redirects=True) as client:
            with client.stream("GET", url, headers={"Accept": ACCEPT}) as response:
                if response.status_code != 200:
                    raise IndexUnreadable(f"{url} answered HTTP {response.status_code}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_INDEX_BYTES:
                        raise IndexUnreadable(f"the index page is larger than {MAX_INDEX_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise IndexUnreadable(f"the index did not answer within {budget:.0f} s")
        return json.loads(bytes(body))
    except ValueError as exc:
        raise IndexUnreadable(f"{url} did not answer JSON") from exc
    except (httpx.HTTPError, OSError) as exc:
        raise IndexUnreadable(f"{url} could not be read: {type(exc).__name__}") from exc


def _read_verdict(url: str, running: str) -> Verdict | str:
    """One fetch and decision: the verdict, or why there is none (a sentence)."""
    try:
        document = fetch_index(url)
    except IndexUnreadable as exc:
        return str(exc)
    verdict = decide(document, running)
    if verdict is None:
        return not_ours(document) or f"the running version {running!r} is not a PEP 440 version"
    return verdict


# -- the checker ----------------------------------------------------------------------------------


def _iso_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class UpdateChecker:
    """The process's verdict, the cache file beside the database, and the apply lock."""

    def __init__(self, app: App, *, running: str = __version__, installation: Installation | None = None) -> None:
        settings = app.settings
        self.enabled = settings.update_check
        self.url = settings.update_check_url
        self.cache_path: Path = settings.update_check_cache
        self.interval = settings.update_check_interval_seconds
        self.running = running
        self.installation = installation if installation is not None else detect_install()
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None
        self._checked_at: str | None = None
        self._unknown_reason: str | None = None  # why the last check gave no verdict
        self._issued = 0  # fetch sequence numbers (UP-4: a later fetch's verdict wins)
        self._applied_from = 0
        self._apply_lock = threading.Lock()
        self._background: threading.Thread | None = None

    # the verdict in memory
    def current(self) -> tuple[Verdict, str | None]:
        if not self.enabled:
            return Verdict("disabled", self.running), None
        with self._lock:
            if self._verdict is None:
                return Verdict("unknown", self.running), None
            return self._verdict, self._checked_at

    def unknown_reason(self) -> str | None:
        """Why the state is ``unknown`` after a check ran (None before any check, or once a verdict is known)."""
        with self._lock:
            return self._unknown_reason if self.enabled and self._verdict is None else None

    def _adopt(self, verdict: Verdict, checked_at: str, issued: int) -> bool:
        with self._lock:
            if issued < self._applied_from:
                return False  # an older request finishing late
            self._verdict, self._checked_at, self._applied_from = verdict, checked_at, issued
            return True

    # start-up (UP-2)
    def start_background(self) -> threading.Thread | None:
        if not self.enabled or self._background is not None:
            return None
        self._background = threading.Thread(target=self._startup_check, name="cpersona-update-check", daemon=True)
        self._background.start()
        return self._background

    def _startup_check(self) -> None:
        try:
            cached = self._read_cache()
            if cached is not None:
                self._adopt(*cached, issued=0)
                return
            self.refresh()
        except Exception:  # noqa: BLE001 — a background check must never take anything down
            log.warning("update check failed", exc_info=True)

    def _read_cache(self) -> tuple[Verdict, str] | None:
        try:
            doc = json.loads(self.cache_path.read_text(encoding="utf-8"))
            fetched_at = doc["fetched_at"]
            age = (datetime.now(timezone.utc) - datetime.fromisoformat(fetched_at)).total_seconds()
            # A verdict read from another page (an earlier build read the `cpersona` one) is not ours.
            if doc.get("running") != self.running or doc.get("url") != self.url or not 0 <= age <= self.interval:
                return None
            raw = doc["verdict"]
            verdict = Verdict(raw["state"], raw["running"], raw.get("kind"), raw.get("available"), raw.get("reason"))
            if verdict.state not in ("ok", "newer", "yanked", "unlisted") or verdict.running != self.running:
                return None
            return verdict, fetched_at
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _write_cache(self, verdict: Verdict, fetched_at: str) -> None:
        doc = {"fetched_at": fetched_at, "running": self.running, "url": self.url, "verdict": asdict(verdict)}
        temp = self.cache_path.with_name(f".{self.cache_path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(doc, handle)
            os.replace(temp, self.cache_path)
        except OSError as exc:
            log.info("update check: could not write %s: %s", self.cache_path, exc)
            temp.unlink(missing_ok=True)

    # refresh (UP-5)
    def refresh(self) -> bool:
        """Fetch now; True when a new verdict was adopted. Bounded by the fetch budget."""
        if not self.enabled:
            return False
        with self._lock:
            self._issued += 1
            issued = self._issued
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(out=_read_verdict(self.url, self.running)), daemon=True)
        worker.start()
        worker.join(FETCH_BUDGET_SECONDS + 0.5)  # nothing waits longer, whatever the network does
        verdict = result.get("out", f"the index did not answer within {FETCH_BUDGET_SECONDS:.0f} s")
        if isinstance(verdict, str):
            log.info("update check: cannot tell: %s", verdict)
            with self._lock:
                self._unknown_reason = verdict[: REASON_MAX_CHARS * 2]
            return False
        fetched_at = _iso_now()
        if not self._adopt(verdict, fetched_at, issued):
            return False
        self._write_cache(verdict, fetched_at)
        return True

    # apply (UP-7, UP-8)
    def apply(self, verdict: Verdict) -> dict[str, Any]:
        install = self.installation.describe(verdict.available)
        if not self.enabled:
            return {
                "applied": False,
                "reason": "update checking is disabled (CPERSONA_UPDATE_CHECK=false), so there is no verdict to act on",
            }
        if verdict.kind is None or verdict.available is None:
            return {"applied": False, "reason": f"nothing newer to install (state={verdict.state})", "install": install}
        if refusal := self.installation.refusal(verdict.available):
            return {"applied": False, "reason": refusal, "install": install}
        if not self._apply_lock.acquire(blocking=False):
            return {
                "applied": False,
                "reason": "another apply is still running in this process; wait for it to end",
                "install": install,
            }
        try:
            exit_code, tail = run_steps(self.installation.steps(verdict.available))
        finally:
            self._apply_lock.release()
        return {
            "applied": exit_code == 0,
            "exit_code": exit_code,
            "output_tail": tail,
            "restart_required": True,
            "install": install,
        }


def start_update_check(app: App) -> UpdateChecker:
    """The once-per-start background check (UP-2); returns at once."""
    checker = app.update_checker
    checker.start_background()
    return checker


# -- the tool (§13.4) -----------------------------------------------------------------------------


def _message(verdict: Verdict, command: str) -> str:
    notes = RELEASE_NOTES.format(version=verdict.available) if verdict.available else None
    how = f"To update, run: {command}." if command else "Update it the way it was installed."
    if verdict.kind == "yanked":
        reason = f" (the publisher's reason: {verdict.reason})" if verdict.reason else ""
        newest = (
            f" The newest release still offered is {verdict.available}; its notes are at {notes}."
            if verdict.available
            else " No newer release is offered yet."
        )
        return (
            f"The release of {DISTRIBUTION} this server runs ({verdict.running}) was withdrawn (yanked) from the "
            f"package index{reason}.{newest} {how} Nothing is updated automatically, and the server has to be "
            "restarted afterwards."
        )
    return (
        f"{DISTRIBUTION} {verdict.available} is available; this server runs {verdict.running}. Read the release "
        f"notes first for what changed and anything to do by hand: {notes}. {how} Nothing is updated "
        "automatically, and the server has to be restarted afterwards."
    )


@dataclass(frozen=True)
class UpdateCheckArguments(Request):
    """``check_update``'s arguments in the types its schema declares; defaults are the schema's."""

    refresh: bool = False
    apply: bool = False


def check_update(app: App, *, refresh: Any = False, apply: Any = False) -> dict[str, Any]:
    """:func:`answer_check_update` for a library caller, whose arguments no schema has checked.

    Anything but ``true`` asks for neither: a refresh uses the network and an apply installs software.
    """
    return answer_check_update(app, UpdateCheckArguments(refresh=refresh is True, apply=apply is True))


def answer_check_update(app: App, args: UpdateCheckArguments) -> dict[str, Any]:
    """Report the verdict; refresh it on request; install the update on request."""
    checker = app.update_checker
    if args.refresh:
        checker.refresh()
    verdict, checked_at = checker.current()
    install = checker.installation.describe(verdict.available)
    response: dict[str, Any] = {
        "enabled": checker.enabled,
        "state": verdict.state,
        "kind": verdict.kind,
        "running": verdict.running,
        "available": verdict.available,
        "reason": verdict.reason,
        "checked_at": checked_at,
        "unknown_reason": checker.unknown_reason(),
        "refreshed": args.refresh,
        "install": install,
        "_meta": {"server_version": __version__},
    }
    if verdict.kind is not None:
        response["message"] = _message(verdict, install["command"])
        if verdict.available:
            response["release_notes"] = RELEASE_NOTES.format(version=verdict.available)
    if args.apply:
        response["apply_result"] = checker.apply(verdict)
    return response


NOTICE_SESSIONS = 256  # declared session keys remembered as "already told" (UP-10)


class NoticeMemory:
    """Who has seen the current verdict's notice on recall: keyless callers once, each key once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verdict: tuple[Any, ...] | None = None
        self.keyless_told = False
        self.sessions: OrderedDict[str, None] = OrderedDict()

    def first_time(self, verdict: tuple[Any, ...], session_key: Any) -> bool:
        key = session_key.strip() if isinstance(session_key, str) else ""
        with self.lock:
            if verdict != self.verdict:  # a changed verdict is news again
                self.verdict, self.keyless_told, self.sessions = verdict, False, OrderedDict()
            if key in ("", "transport"):
                told, self.keyless_told = self.keyless_told, True
                return not told
            if key in self.sessions:
                self.sessions.move_to_end(key)
                return False
            self.sessions[key] = None
            while len(self.sessions) > NOTICE_SESSIONS:
                self.sessions.popitem(last=False)
            return True


def recall_update_notice(app: App, session_key: Any) -> dict[str, Any] | None:
    """The ``update`` key of a recall answer: once per process for keyless callers, once per key (UP-10)."""
    notice = update_notice(app)
    if notice is None:
        return None
    memory = app.update_notices
    verdict = (notice["kind"], notice["running"], notice["available"], notice.get("reason"))
    return notice if memory.first_time(verdict, session_key) else None


def update_notice(app: App) -> dict[str, Any] | None:
    """The verdict for other surfaces (recall, check_health) when there is something to say (UP-9, UP-10)."""
    checker = App.update_checker.if_built(app)  # no check started: nothing to say
    if checker is None:
        return None
    verdict, _ = checker.current()
    if verdict.kind is None:
        return None
    install = checker.installation.describe(verdict.available)
    notice: dict[str, Any] = {
        "kind": verdict.kind,
        "running": verdict.running,
        "available": verdict.available,
        "install": {"method": install["method"], "command": install["command"], "restart_required": True},
        "message": _message(verdict, install["command"]),
        "release_notes": RELEASE_NOTES.format(version=verdict.available) if verdict.available else None,
    }
    if verdict.kind == "yanked":
        notice["reason"] = verdict.reason
    return notice
