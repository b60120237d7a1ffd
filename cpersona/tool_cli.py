"""The MCP tools, called in-process by the command line (``cpersona search``, ``cpersona hook`` ...).

A command here is one more client of the tools, not a second implementation of
them: each operation goes through :func:`cpersona.mcp.dispatch.call_tool` with
the same registry and the same gate chain ``cpersona serve`` builds for stdio
(the ACL with the reserved principal ``local`` when CPERSONA_ACL_FILE is set,
then the no-persist pause), so validation, ownership, isolation and locks apply
exactly as they do to an agent's call.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class ToolRefused(Exception):
    """A tool answered ``ok: false`` (or an MCP-level error); the message is its own sentence."""

    def __init__(self, tool: str, answer: dict[str, Any]) -> None:
        self.tool = tool
        self.answer = answer
        super().__init__(self.sentence(tool, answer))

    @staticmethod
    def sentence(tool: str, answer: dict[str, Any]) -> str:
        if answer.get("error") == "permission_denied":  # the ACL's code; its facts say what was missing
            needed = f"{answer.get('required', 'access')} on agent {answer.get('agent_id', '?')!r}"
            detail = f" ({answer['detail']})" if answer.get("detail") else ""
            return f"permission denied: ACL client {answer.get('client_id', '?')!r} lacks {needed}{detail}"
        return str(answer.get("error") or answer.get("reason") or f"{tool} refused the call")


class LocalTools:
    """The tool surface of one opened database; :meth:`call` answers as the MCP tool would."""

    def __init__(self, app: Any, registry: Any, gates: Any) -> None:
        self.app = app
        self.registry = registry
        self.gates = gates

    def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        """The tool's answer; a refusal raises :class:`ToolRefused`."""
        answer = self.answer(name, **arguments)
        if answer.get("ok") is False:
            raise ToolRefused(name, answer)
        return answer

    def answer(self, name: str, **arguments: Any) -> dict[str, Any]:
        """The tool's answer as it is, refusals included."""
        import anyio

        from cpersona.mcp.dispatch import call_tool

        outcome = anyio.run(call_tool, self.app, self.registry, self.gates, name, arguments)
        if outcome.is_error and outcome.payload.get("ok") is not False:
            return {"ok": False, **outcome.payload}
        return outcome.payload


@contextmanager
def open_tools(*, must_exist: bool = True) -> Iterator[LocalTools]:
    """The tools over the configured database (``--db`` / CPERSONA_DB_PATH), upgraded as ``serve`` would.

    Configuration and database failures raise ``admin_cli._Exit`` with serve's exit status.
    """
    from cpersona import cli
    from cpersona.admin_cli import _app, _Exit, _settings
    from cpersona.config import ConfigError
    from cpersona.embedding.client import build_embedder
    from cpersona.mcp.tools import default_registry

    settings = _settings()
    # A denial is this command's own one-line answer; the ACL's server-side log line would repeat it.
    logging.getLogger("cpersona.mcp.acl").setLevel(logging.ERROR)
    try:
        policy, _, _ = cli._preflight(settings, http=False)
        embedder = build_embedder(settings)
    except (ConfigError, ValueError) as exc:
        raise _Exit(str(exc), cli.EXIT_BAD_CONFIG) from None
    try:
        with _app(must_exist=must_exist, settings=settings, embedder=embedder) as app:
            yield LocalTools(app, default_registry(), cli.tool_gates(policy, settings, "stdio"))
    finally:
        if embedder is not None:
            embedder.close()


def print_json(answer: Any) -> None:
    print(json.dumps(answer, ensure_ascii=False, indent=2, default=str))


def say(message: str) -> None:
    print(f"cpersona: {message}", file=sys.stderr)
