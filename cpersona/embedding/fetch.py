"""Downloading a profile's model folder into the cache, once, checked by sha256.

The files arrive in a private ``.partial`` folder beside the target and become
the model folder with one rename, so a process that reads the cache sees
either nothing or a complete folder — never half a file, whether the download
was interrupted or another process was fetching the same model at once.

Checksums: a file whose profile pins a sha256 must match it. Otherwise the
source's own word is used — ``X-Linked-Etag`` (the Hugging Face hub sends the
sha256 of a large file there) or a ``SHA256SUMS`` file beside the files (what a
folder served from another machine's cache carries). A file for which neither
exists is kept and its sha256 recorded, with a log line saying so. Every sum
ends up in the folder's ``SHA256SUMS``, which ``fetch-model --verify`` checks.

A source is a URL under which the files sit at their ``remote_path`` (the
hub's layout, where the folder config comes from the profile) or, for
``CPERSONA_EMBEDDING_MODEL_SOURCE``, at their folder name with the folder's
own ``cpersona-model.json`` beside them — so an offline network can serve one
machine's cache folder to the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from cpersona.embedding.endpoints import safe_endpoint
from cpersona.embedding.local_model import file_sha256
from cpersona.embedding.profiles import (
    CONFIG_FILE,
    SUMS_FILE,
    ModelConfig,
    ModelFolderError,
    Profile,
    format_sums,
    parse_sums,
    read_sums,
    size_text,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECS = 10.0
READ_TIMEOUT_SECS = 60.0
PROGRESS_INTERVAL_SECS = 1.0
MAX_SUMS_BYTES = 64 * 1024

Progress = Callable[[str], None]


class FetchError(Exception):
    """The model could not be fetched; one line saying from where and why."""


@dataclass(frozen=True)
class FetchPlan:
    profile: Profile
    target: Path
    source: str  # base URL
    mirror: bool  # files sit at their folder name, not their hub path

    def url(self, remote_path: str, name: str) -> str:
        return f"{self.source.rstrip('/')}/{name if self.mirror else remote_path}"


def cache_folder(cache_dir: Path, profile: Profile) -> Path:
    return Path(cache_dir).expanduser() / profile.name


def is_complete(folder: Path, profile: Profile) -> bool:
    """Whether ``folder`` holds every file of the profile and its config (what a finished fetch leaves)."""
    return (
        (folder / CONFIG_FILE).is_file()
        and (folder / SUMS_FILE).is_file()
        and all((folder / f.name).is_file() for f in profile.files)
    )


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fetch_model(
    profile: Profile,
    cache_dir: Path,
    *,
    source: str | None = None,
    progress: Progress = stderr_progress,
    transport: httpx.BaseTransport | None = None,
) -> Path:
    """The profile's model folder in the cache, downloading it first if it is not there."""
    target = cache_folder(cache_dir, profile)
    if is_complete(target, profile):
        return target
    plan = FetchPlan(profile, target, source or profile.source, mirror=bool(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{profile.name}.partial-{os.getpid()}-{time.monotonic_ns()}"
    partial.mkdir()
    try:
        with httpx.Client(
            timeout=httpx.Timeout(READ_TIMEOUT_SECS, connect=CONNECT_TIMEOUT_SECS),
            follow_redirects=True,
            transport=transport,
        ) as http:
            published = _published_sums(http, plan) if plan.mirror else {}
            sums = {
                f.name: _download(
                    http, plan, f.name, f.remote_path, f.sha256 or published.get(f.name), partial / f.name, progress
                )
                for f in profile.files
            }
            if plan.mirror:  # a served cache folder brings the config it was fetched with
                _download(
                    http, plan, CONFIG_FILE, CONFIG_FILE, published.get(CONFIG_FILE), partial / CONFIG_FILE, progress
                )
                _check_mirrored_config(partial, profile, plan.source)
            else:
                (partial / CONFIG_FILE).write_text(profile.config.to_json(), encoding="utf-8")
        (partial / SUMS_FILE).write_text(format_sums(sums), encoding="ascii")
        try:
            os.replace(partial, target)
        except OSError:
            if not is_complete(target, profile):  # not a lost race with another fetch: a real failure
                raise
        progress(f"fetched {profile.name} into {target}")
        return target
    except httpx.HTTPError as exc:
        raise FetchError(
            f"could not fetch {profile.name} from {safe_endpoint(plan.source)}: {type(exc).__name__}: {exc}"
        ) from None
    except OSError as exc:
        raise FetchError(f"could not write {profile.name} into {target.parent}: {exc}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def verify_folder(folder: Path) -> list[str]:
    """Files of the folder whose sha256 no longer matches its ``SHA256SUMS`` (or are gone)."""
    bad = []
    for name, digest in read_sums(folder).items():
        path = folder / name
        if not path.is_file() or file_sha256(path) != digest:
            bad.append(name)
    return bad


def _check_mirrored_config(folder: Path, profile: Profile, source: str) -> None:
    try:
        served = ModelConfig.read(folder)
    except ModelFolderError as exc:
        raise FetchError(f"{safe_endpoint(source)} serves an unusable {CONFIG_FILE}: {exc}") from None
    if served.name != profile.name:
        raise FetchError(f"{safe_endpoint(source)} serves the model {served.name!r}, not {profile.name!r}")


def _published_sums(http: httpx.Client, plan: FetchPlan) -> dict[str, str]:
    url = f"{plan.source.rstrip('/')}/{SUMS_FILE}"
    response = http.get(url)
    if response.status_code == 404:
        return {}
    response.raise_for_status()
    return parse_sums(response.content[:MAX_SUMS_BYTES].decode("utf-8", "replace"))


def _download(
    http: httpx.Client,
    plan: FetchPlan,
    name: str,
    remote_path: str,
    expected: str | None,
    path: Path,
    progress: Progress,
) -> str:
    url = plan.url(remote_path, name)
    digest = hashlib.sha256()
    received = 0
    with http.stream("GET", url) as response:
        if not response.is_success:
            raise FetchError(
                f"could not fetch {plan.profile.name}: GET {safe_endpoint(url)} answered "
                f"{response.status_code} {response.reason_phrase}"
            )
        declared = response.headers.get("content-length")
        total = int(declared) if declared and declared.isdigit() else None
        expected = expected or _etag_sha256(response)
        shown_at = float("-inf")
        with path.open("wb") as out:
            for chunk in response.iter_bytes(1 << 16):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                now = time.monotonic()
                if now - shown_at >= PROGRESS_INTERVAL_SECS:
                    shown_at = now
                    progress(_progress_line(plan.profile.name, name, received, total))
    progress(_progress_line(plan.profile.name, name, received, total or received))
    actual = digest.hexdigest()
    if expected is None:
        log.warning(
            "%s: the source publishes no sha256 for %s; recorded %s for later checks", plan.profile.name, name, actual
        )
    elif actual != expected.lower():
        raise FetchError(
            f"{name} of {plan.profile.name} from {safe_endpoint(url)} has sha256 {actual}, "
            f"expected {expected.lower()}: the download is corrupt or the source changed; "
            "nothing was kept"
        )
    return actual


def _etag_sha256(response: httpx.Response) -> str | None:
    tag = (response.headers.get("x-linked-etag") or "").strip().strip('"').removeprefix("W/").strip('"')
    return tag.lower() if len(tag) == 64 and all(c in "0123456789abcdefABCDEF" for c in tag) else None


def _progress_line(model: str, name: str, received: int, total: int | None) -> str:
    if total:
        return f"fetching {model}: {name} {size_text(received)} of {size_text(total)} ({100 * received // total}%)"
    return f"fetching {model}: {name} {size_text(received)}"
