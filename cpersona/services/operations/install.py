"""How this server was installed, and the command that would update it (spec admin-and-safety UP-6..UP-8).

    uvx       the interpreter lives in a uv tool cache entry (``…/archive-v0/<hash>``):
              an install there is discarded at the next launch, so the update
              belongs in the client's launch arguments; never applied here.
              The command is ``uvx --from cpersona-server==X cpersona``; the
              short ``uvx cpersona@X`` would run CPersona 2.6, another program
    checkout  the package is not under site-packages: a git working tree.
              On a branch: ``git pull`` then reinstall (editable stays editable);
              parked at a tag (detached HEAD): the fetch-and-checkout form, shown
              but never applied
    pip       anything else: ``python -m pip install --upgrade cpersona-server==X``
    unknown   the package location cannot be told: no command

Steps run as argv lists, never through a shell, and only when a caller asks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpersona import DISTRIBUTION

COMMAND = "cpersona"  # the console script; the distribution that provides it is DISTRIBUTION
OUTPUT_TAIL_LINES = 40  # UP-8
# A version string from the network reaches a command only if it looks like one (UP-6).
SAFE_VERSION = re.compile(r"^[0-9A-Za-z.+!-]+$")
_COMMIT_ID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _safe(version: str | None) -> str | None:
    return version if isinstance(version, str) and SAFE_VERSION.match(version) else None


@dataclass(frozen=True)
class Installation:
    method: str  # "uvx" | "checkout" | "pip" | "unknown"
    python: str
    repo: Path | None = None
    detached: bool = False
    editable: bool = False
    installer: tuple[str, ...] = ()

    def steps(self, available: str | None) -> list[list[str]]:
        """The update as argv lists, in order (what ``apply`` runs and ``command`` shows)."""
        version = _safe(available)
        if self.method == "pip":
            target = f"{DISTRIBUTION}=={version}" if version else DISTRIBUTION
            return [[self.python, "-m", "pip", "install", "--upgrade", target]]
        if self.method == "checkout" and self.repo is not None:
            repo = str(self.repo)
            reinstall = [*self.installer, *(["-e"] if self.editable else []), repo]
            if self.detached:
                tag = f"v{version}" if version else "v<version>"
                return [["git", "-C", repo, "fetch", "--tags"], ["git", "-C", repo, "checkout", tag], reinstall]
            return [["git", "-C", repo, "pull"], reinstall]
        if self.method == "uvx":
            source = f"{DISTRIBUTION}=={version}" if version else f"{DISTRIBUTION}@latest"
            return [["uvx", "--from", source, COMMAND]]
        return []

    def command(self, available: str | None) -> str:
        return " && ".join(shlex.join(step) for step in self.steps(available))

    def note(self) -> str:
        if self.method == "uvx":
            return (
                "This server runs from a uv tool cache entry, which the next launch replaces: change the "
                "launch arguments in your MCP client's configuration to the command shown, then restart it."
            )
        if self.method == "checkout" and self.detached:
            return "The checkout is parked at a tag (detached HEAD): fetch the tags and check out the new one."
        if self.method == "unknown":
            return "The location of the installed package could not be determined; update it the way it was installed."
        return ""

    def describe(self, available: str | None) -> dict[str, Any]:
        return {
            "method": self.method,
            "command": self.command(available),
            "note": self.note(),
            "restart_required": True,
        }

    def refusal(self, available: str | None) -> str | None:
        """Why ``apply`` must not run for this install, or None (UP-7)."""
        if self.method == "uvx":
            return (
                f"apply is not available for a uvx install: an install here would be discarded at the next "
                f"launch; change your client's launch arguments to `{self.command(available)}` instead"
            )
        if self.method not in ("pip", "checkout"):
            return f"apply is not available for a {self.method} install"
        if self.method == "checkout" and (self.detached or not self._on_branch()):
            detached = Installation(self.method, self.python, self.repo, True, self.editable, self.installer)
            return (
                f"the checkout at {self.repo} is not on a branch (detached HEAD), so pulling cannot update it; "
                f"run `{detached.command(available)}` yourself"
            )
        if _safe(available) is None:
            return "the index named a version that is not safe to put in a command"
        return None

    def _on_branch(self) -> bool:
        try:
            probe = subprocess.run(
                ["git", "-C", str(self.repo), "symbolic-ref", "-q", "HEAD"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return True  # no verdict from git: let the pull itself report
        return probe.returncode != 1


def _installer(python: str) -> tuple[str, ...]:
    if importlib.util.find_spec("pip") is None and shutil.which("uv"):
        return ("uv", "pip", "install", "--python", python)
    return (python, "-m", "pip", "install")


def _head_is_detached(repo: Path) -> bool:
    git = repo / ".git"
    try:
        if git.is_file():  # a worktree: ".git" names the real git directory
            pointer = git.read_text(encoding="utf-8").strip()
            git = (repo / pointer.removeprefix("gitdir:").strip()).resolve()
        return bool(_COMMIT_ID.match((git / "HEAD").read_text(encoding="utf-8").strip()))
    except OSError:
        return False


def _installed_editable() -> bool:
    """PEP 610: pip records an editable install in direct_url.json."""
    # Every record is consulted: a source tree's own *.egg-info may shadow the installed one.
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        try:
            raw = dist.read_text("direct_url.json")
            if raw and json.loads(raw).get("dir_info", {}).get("editable"):
                return True
        except (ValueError, AttributeError, OSError):
            continue
    return False


def detect_install(
    package_dir: Path | None = None, *, prefix: str | None = None, python: str | None = None
) -> Installation:
    python = python or sys.executable
    prefix = prefix if prefix is not None else sys.prefix
    if package_dir is None:
        import cpersona

        location = getattr(cpersona, "__file__", None)
        if not location:
            return Installation("unknown", python)
        package_dir = Path(location).resolve().parent
    if Path(prefix).parent.name == "archive-v0":
        return Installation("uvx", python)
    if not {"site-packages", "dist-packages"} & set(package_dir.parts):
        repo = package_dir.parent
        return Installation(
            "checkout", python, repo, _head_is_detached(repo), _installed_editable(), _installer(python)
        )
    return Installation("pip", python)


def run_steps(steps: list[list[str]]) -> tuple[int, list[str]]:
    """Run each step to its end (no timeout), stop at the first failure; exit code and the last 40 lines."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "PIP_NO_INPUT": "1"}
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    code = 0
    for argv in steps:
        tail.append("$ " + shlex.join(argv))
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            tail.append(f"could not start {argv[0]}: {exc.strerror or exc}")
            return 127, list(tail)
        assert process.stdout is not None
        for raw in process.stdout:
            tail.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
        code = process.wait()
        if code != 0:
            break
    return code, list(tail)
