"""Per-client capabilities (spec transport-and-config §4): who may call what, on which agent.

Three parts, each in one place:

- the ACL file: parsing and validation (ACL-1..ACL-7), the token table and the
  constant-time lookup of a presented bearer credential (ACL-8);
- the demands of §4.4: functions turning a call's arguments into *demands*
  ("read on alice", "read-write on every agent"); each tool's declaration
  names its own (:class:`cpersona.mcp.demands.Access`), or leaves it to its
  annotations (read-only reads the named agent, anything else writes it);
- :class:`AclGate`, the gate (see :mod:`cpersona.mcp.gates`) that checks the
  demands of every call against the caller's grants, answers a denial in the
  ACL-15 shape, and fills in an omitted ``store`` agent (ACL-17/18).

The caller is a :class:`Principal`. HTTP authentication binds it to the request
through :data:`current_principal` (the MCP SDK carries context variables from
the ASGI request to the tool handler); over stdio the gate is built with the
reserved principal ``local`` (T-2).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from cpersona.mcp.demands import access_for
from cpersona.mcp.gates import CallNext, Response, ToolCall

log = logging.getLogger(__name__)

LOCAL = "local"
ALL = "*"
ME = "@me"
_SCOPE_ARGUMENTS = ("agent_id", "source_agent_id", "target_agent_id")

NONE, READ, READ_WRITE = 0, 1, 2  # the lattice of ACL-10
LEVELS = {"none": NONE, "read": READ, "read-write": READ_WRITE}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CLIENT_KEYS = frozenset({"client_id", "token", "grants", "per_subject"})


class AclConfigError(Exception):
    """A defect in the ACL file; the server refuses to start (ACL-6)."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a client id, plus issuer and subject for an OAuth-verified caller."""

    client_id: str
    issuer: str | None = None
    subject: str | None = None


# Bound by the HTTP authentication middleware for the duration of one request.
current_principal: ContextVar[Principal | None] = ContextVar("cpersona_principal", default=None)


@dataclass(frozen=True)
class AclClient:
    client_id: str
    token: str | None
    grants: Mapping[str, int]
    per_subject: bool = False

    def level_on(self, agent: str) -> int:
        """ACL-11: the exact grant, else the ``*`` grant, else none."""
        if agent in self.grants:
            return self.grants[agent]
        return self.grants.get(ALL, NONE)

    def sweep_level(self) -> int:
        """ACL-12: a ``*`` demand is met only at the weakest grant held, and only with a ``*`` grant."""
        if ALL not in self.grants:
            return NONE
        return min(self.grants.values())

    def connection_agent(self) -> str | None:
        """ACL-17: the one agent a client can write to, when there is exactly one."""
        if self.grants.get(ALL) == READ_WRITE:
            return None
        writable = [agent for agent, level in self.grants.items() if agent != ALL and level == READ_WRITE]
        return writable[0] if len(writable) == 1 else None


class AclPolicy:
    """The grant table of one ACL file, as loaded at start-up."""

    def __init__(self, clients: list[AclClient]) -> None:
        self.clients: dict[str, AclClient] = {c.client_id: c for c in clients}
        self._tokens = [(c.token.encode("utf-8"), c.client_id) for c in clients if c.token is not None]
        self.env_refs: frozenset[str] = frozenset()  # variables the file's ${NAME} tokens read

    def client(self, client_id: str) -> AclClient | None:
        return self.clients.get(client_id)

    def resolve_token(self, credential: bytes) -> Principal | None:
        """The client whose static token equals ``credential``; every entry is compared (ACL-8)."""
        found: str | None = None
        for token, client_id in self._tokens:
            if hmac.compare_digest(token, credential) and found is None:
                found = client_id
        return Principal(found) if found is not None and credential else None

    @property
    def has_per_subject(self) -> bool:
        return any(c.per_subject for c in self.clients.values())


# --- the file -----------------------------------------------------------------


def load_policy(settings: Any, environ: Mapping[str, str] | None = None) -> AclPolicy | None:
    """The policy CPERSONA_ACL_FILE names, or None without one (T-7 step 3, ACL-7).

    Read once at start-up: a changed file takes effect on restart, so the
    policy being served is always one that was validated whole.
    """
    if settings.acl_file is None:
        return None
    policy = load_acl_file(Path(settings.acl_file).expanduser(), environ)
    if settings.auth_token is not None and settings.auth_token.get_secret_value():
        log.warning(
            "CPERSONA_AUTH_TOKEN is ignored in ACL mode; a client that should keep using it must be listed in %s",
            settings.acl_file,
        )
    return policy


def acl_gates(policy: AclPolicy | None, settings: Any, transport: str) -> list[AclGate]:
    """The ACL gate for the chain, first of all gates; none without a policy."""
    if policy is None:
        return []
    return [AclGate(policy, settings, Principal(LOCAL) if transport == "stdio" else None)]


def load_acl_file(path: Path, environ: Mapping[str, str] | None = None) -> AclPolicy:
    """Read and validate ``path``; any defect raises AclConfigError naming the client (ACL-1..ACL-6)."""
    environ = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"cannot read the ACL file {path}: {exc}") from None
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise AclConfigError(f"the ACL file {path} is not valid JSON: {exc}") from None
    policy = parse_acl(document, environ)
    _warn_if_readable_by_others(path)
    return policy


def parse_acl(document: Any, environ: Mapping[str, str]) -> AclPolicy:
    if not isinstance(document, dict) or set(document) != {"clients"}:
        raise AclConfigError('the ACL file must be exactly {"clients": [...]}')
    entries = document["clients"]
    if not isinstance(entries, list) or not entries:
        raise AclConfigError('"clients" must be a non-empty list')
    clients: list[AclClient] = []
    seen_ids: set[str] = set()
    seen_tokens: dict[str, str] = {}
    for index, entry in enumerate(entries):
        client = _parse_client(index, entry, environ)
        if client.client_id in seen_ids:
            raise AclConfigError(f"client {client.client_id!r} is listed twice")
        seen_ids.add(client.client_id)
        if client.token is not None:
            if client.token in seen_tokens:
                raise AclConfigError(
                    f"clients {seen_tokens[client.token]!r} and {client.client_id!r} "
                    "share one token; tokens must be unique"
                )
            seen_tokens[client.token] = client.client_id
        clients.append(client)
    policy = AclPolicy(clients)
    policy.env_refs = frozenset(
        m.group(1)
        for e in entries
        if isinstance(e, dict) and isinstance(e.get("token"), str) and (m := _ENV_REF.fullmatch(e["token"]))
    )
    if policy.has_per_subject:
        # ACL-20..23 need the alias ledger, which this build does not have; a
        # row whose boundary we cannot enforce must not be served (ACL-6).
        who = next(c.client_id for c in clients if c.per_subject)
        raise AclConfigError(f"client {who!r}: per_subject partitioning is not supported by this build")
    return policy


def _parse_client(index: int, entry: Any, environ: Mapping[str, str]) -> AclClient:
    if not isinstance(entry, dict):
        raise AclConfigError(f"clients[{index}] must be an object")
    unknown = sorted(set(entry) - _CLIENT_KEYS)
    client_id = entry.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        raise AclConfigError(f"clients[{index}]: client_id must be a non-empty string")
    who = f"client {client_id!r}"
    if unknown:
        raise AclConfigError(f"{who}: unknown key(s) {', '.join(unknown)}")
    grants = entry.get("grants")
    if not isinstance(grants, dict):
        raise AclConfigError(f"{who}: grants must be an object mapping agent patterns to none/read/read-write")
    parsed: dict[str, int] = {}
    for agent, level in grants.items():
        if not agent:
            raise AclConfigError(f"{who}: a grant's agent pattern must be a non-empty string")
        if level not in LEVELS:
            raise AclConfigError(f"{who}: grant {agent!r} is {level!r}; expected none, read or read-write")
        parsed[agent] = LEVELS[level]
    per_subject = entry.get("per_subject", False)
    if not isinstance(per_subject, bool):
        raise AclConfigError(f"{who}: per_subject must be true or false")
    if client_id == LOCAL:
        if entry.get("token") is not None:
            raise AclConfigError(f"{who}: the stdio principal has no token; leave it out or set it to null")
        if per_subject:
            raise AclConfigError(f"{who}: per_subject is not allowed on the stdio principal")
        return AclClient(client_id, None, parsed)
    if "token" not in entry:
        raise AclConfigError(f"{who}: token is required (a string, or null for a principal an OAuth verifier asserts)")
    token = entry["token"]
    if token is None:
        return AclClient(client_id, None, parsed, per_subject)
    if per_subject:
        raise AclConfigError(f"{who}: per_subject is allowed only on a token: null row")
    return AclClient(client_id, _resolve_token(who, token, environ), parsed)


def _resolve_token(who: str, token: Any, environ: Mapping[str, str]) -> str:
    if not isinstance(token, str) or not token:
        raise AclConfigError(f"{who}: token must be a non-empty string or null")
    whole = _ENV_REF.fullmatch(token)
    if whole:
        name = whole.group(1)
        token = environ.get(name, "")
        if not token:
            raise AclConfigError(f"{who}: token refers to ${{{name}}}, which is unset or empty")
    elif "${" in token:
        raise AclConfigError(f"{who}: token holds a partial ${{...}} reference; a reference must be the whole value")
    if not token.isascii():
        raise AclConfigError(f"{who}: token must be ASCII")
    if token != token.strip():
        raise AclConfigError(
            f"{who}: token has leading or trailing whitespace (a trailing newline from `echo` is the usual cause)"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token):
        raise AclConfigError(f"{who}: token contains a control character")
    return token


def _warn_if_readable_by_others(path: Path) -> None:
    if os.name != "posix":
        return
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "the ACL file %s is readable by group or others (mode %o); it holds bearer tokens, chmod 600 it",
            path,
            stat.S_IMODE(mode),
        )


# --- the classification (§4.4) -------------------------------------------------


@dataclass(frozen=True)
class Demand:
    """One capability a call needs: ``level`` on ``agent`` (``*`` = every agent).

    ``argument`` names the scope argument it came from (None for an intrinsic
    sweep) and ``cause`` explains an intrinsic sweep; both feed the denial's
    ``detail`` (ACL-16).
    """

    agent: str
    level: int
    argument: str | None = None
    cause: str | None = None
    how: str = "named"  # named | omitted | star | non_string | intrinsic


def scope_demand(arguments: Mapping[str, Any], argument: str, level: int) -> Demand:
    """ACL-13: a scope argument that is not a non-empty string demands every agent."""
    value = arguments.get(argument)
    if isinstance(value, str) and value:
        return Demand(value, level, argument, how="star" if value == ALL else "named")
    if argument not in arguments or value == "":
        return Demand(ALL, level, argument, how="omitted")
    return Demand(ALL, level, argument, how="non_string")


def sweep(level: int, cause: str) -> Demand:
    return Demand(ALL, level, None, cause, how="intrinsic")


_CROSS_AGENT_REPAIRS = ("block_index", "coarse_index", "dedup_msg_id_index", "file_permissions")
# Over HTTP an unset CPERSONA_EXPORT_DIR confines paths to <database directory>/exports/
# (portability.paths), but no agent owns a file there on record, so one agent's grant cannot
# cover overwriting or reading another agent's export.
_UNCONFINED_PATH = (
    "CPERSONA_EXPORT_DIR is unset, so the path argument names any file the caller chooses "
    "under the database directory's exports/ folder, which no agent owns on record, and the "
    "call is not confined to one agent"
)
_PROCESS_PROPERTY = (
    "the running server's version belongs to the process, not to any agent's data, so "
    "no argument can narrow this call to one agent"
)

Classifier = Callable[[Mapping[str, Any], Any], list[Demand]]


def any_principal(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return []


def read_agent(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return [scope_demand(arguments, "agent_id", READ)]


def write_agent(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return [scope_demand(arguments, "agent_id", READ_WRITE)]


def _pause_bucket(verb: str, effect: str) -> Classifier:
    cause = (
        f"a {verb} acts on a bucket any caller can name (a session_key is a hint, not a credential), and "
        f"without one it {effect} for every keyless session this process serves, not only the caller's"
    )
    return lambda arguments, settings: [sweep(READ_WRITE, cause)]


def findings_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return [
        sweep(
            READ,
            "findings cover the whole database by contract, so no argument narrows them to one "
            "agent; check_health(agent_id=...) gives an agent-scoped report",
        )
    ]


def update_check_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return [sweep(READ_WRITE if arguments.get("apply") is True else READ, _PROCESS_PROPERTY)]


def health_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    if arguments.get("fix") is not True:
        return [scope_demand(arguments, "agent_id", READ)]
    demands = [scope_demand(arguments, "agent_id", READ_WRITE)]
    checks = arguments.get("checks")
    if not checks or any(name in _CROSS_AGENT_REPAIRS for name in checks):
        demands.append(
            sweep(
                READ_WRITE,
                "this call runs a repair whose effect reaches every agent ("
                + ", ".join(_CROSS_AGENT_REPAIRS)
                + "), so no agent_id narrows it — naming the "
                "checks you want in `checks` does",
            )
        )
    return demands


def deep_check_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    return [scope_demand(arguments, "agent_id", READ_WRITE if arguments.get("fix") is True else READ)]


def merge_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    source_level = READ_WRITE if arguments.get("mode") == "move" else READ
    return [
        scope_demand(arguments, "source_agent_id", source_level),
        scope_demand(arguments, "target_agent_id", READ_WRITE),
    ]


def export_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    if settings.export_dir is None:
        return [sweep(READ_WRITE, _UNCONFINED_PATH)]
    demands = [scope_demand(arguments, "agent_id", READ_WRITE)]
    owner = _existing_export_owner(arguments.get("output_path"), settings.export_dir)
    if owner is not None:
        demands.append(owner)
    return demands


def import_demands(arguments: Mapping[str, Any], settings: Any) -> list[Demand]:
    if settings.export_dir is None:
        return [sweep(READ_WRITE, _UNCONFINED_PATH)]
    demands = [scope_demand(arguments, "target_agent_id", READ_WRITE)]
    demands += _import_sources(arguments.get("input_path"), settings)
    return demands


# The demands each kind of tool makes, named by :mod:`cpersona.mcp.demands` (a
# tool's declaration holds its Access); the pause tools share one rule.
pause_bucket = _pause_bucket("pause", "stops writes")
resume_bucket = _pause_bucket("resume", "restarts writes")


# --- files that name agents (export/import under CPERSONA_EXPORT_DIR) -------------


def _confined(raw: Any, export_dir: Path) -> Path | None:
    # The same rule the service applies; a path it would refuse is refused
    # there, so it adds no demand here.
    from cpersona.services.portability.paths import confine
    from cpersona.services.responses import ToolFailure

    try:
        return confine(raw, export_dir, "path")
    except ToolFailure:
        return None


def _existing_export_owner(raw: Any, export_dir: Path) -> Demand | None:
    """Overwriting a file is writing to whoever owns it: its export header's agent, or ``*``."""
    path = _confined(raw, export_dir)
    if path is None or not path.exists():
        return None
    from cpersona.services.portability.paths import first_record

    header = first_record(path)
    agent = header.get("agent_id") if header and header.get("_type") == "header" else None
    if isinstance(agent, str) and agent and agent != ALL:
        return Demand(agent, READ_WRITE, "output_path")
    cause = (
        "the destination already holds "
        + (
            "an all-agents export"
            if header and header.get("_type") == "header"
            else "a file that is not a single-agent export"
        )
        + ", which this call would overwrite"
    )
    return sweep(READ_WRITE, cause)


def _import_sources(raw: Any, settings: Any) -> list[Demand]:
    """Reading a file's records is reading every agent it names (header and records)."""
    path = _confined(raw, settings.export_dir)
    if path is None or not path.is_file():
        return []
    from cpersona.services.portability.jsonl import read_lines
    from cpersona.services.responses import ToolFailure

    agents: dict[str, None] = {}
    try:
        for line in read_lines(path, settings.max_import_bytes):
            record = line.record
            if record is None or "agent_id" not in record:
                continue
            agent = record["agent_id"]
            all_agents = record.get("_type") == "header" and agent == ""
            if not isinstance(agent, str) or all_agents:
                cause = (
                    "the file is an all-agents export"
                    if all_agents
                    else f"line {line.number} carries a non-string agent id"
                )
                return [sweep(READ, cause + ", so importing it reads every agent")]
            if agent:
                agents.setdefault(agent)
    except ToolFailure:
        return []  # the service reports the unreadable file itself
    return [Demand(agent, READ, "input_path") for agent in agents]


# --- the gate -------------------------------------------------------------------


class AclGate:
    """Checks every call's demands against the caller's grants (spec §4.3-§4.6).

    ``default_principal`` is the caller when no request bound one: ``local``
    over stdio; None over HTTP, where a missing principal is a wiring defect
    and denied (ACL-14).
    """

    def __init__(self, policy: AclPolicy, settings: Any, default_principal: Principal | None = None) -> None:
        self.policy = policy
        self.settings = settings
        self.default_principal = default_principal

    async def __call__(self, call: ToolCall, call_next: CallNext) -> Response:
        tool = call.spec.name
        principal = call.context.get("principal") or current_principal.get() or self.default_principal
        if principal is None:
            log.error("ACL: no principal resolved for a call of %s; denied", tool)
            return self._deny(call, None, "?", detail="no principal resolved")
        access = access_for(call.spec)
        client = self.policy.client(principal.client_id)
        arguments = dict(call.arguments)
        sentinel = next((name for name in _SCOPE_ARGUMENTS if arguments.get(name) == ME), None)
        if sentinel is not None:
            # ACL-21: "@me" means "my own partition", which only a per-subject
            # client has; taken literally it would name a shared agent.
            return self._deny(
                call,
                Demand(ME, READ, sentinel),
                principal.client_id,
                detail=(
                    f'{sentinel} was sent as "@me", a sentinel honoured only for a per_subject client; this client '
                    "has no per-subject partition, so name the agent itself"
                ),
            )
        resolved = None
        if access.fills_agent and "agent_id" not in arguments and client is not None:
            resolved = client.connection_agent()
            if resolved is not None:
                arguments["agent_id"] = resolved
        if access.reads_files:
            # Reading an import file's agents can take a while; the event loop keeps serving meanwhile.
            demands = await anyio.to_thread.run_sync(access.demands, arguments, self.settings)
        else:
            demands = access.demands(arguments, self.settings)
        for demand in demands:
            if client is None:
                return self._deny(
                    call,
                    demand,
                    principal.client_id,
                    detail=(
                        "this client has no entry in the ACL grant table, so no agent is reachable at any level — an "
                        "operator running ACL mode states every principal explicitly, this one included"
                    ),
                )
            held = client.sweep_level() if demand.agent == ALL else client.level_on(demand.agent)
            if held < demand.level:
                return self._deny(call, demand, principal.client_id, detail=_detail(tool, demand, demands, client))
        if resolved is None:
            return await call_next(call)
        response = await call_next(call.with_arguments(arguments))
        if isinstance(response, dict):
            response["resolved_agent_id"] = resolved
        return response

    def _deny(self, call: ToolCall, demand: Demand | None, client_id: str, *, detail: str | None) -> Response:
        tool = call.spec.name
        extra: dict[str, Any] = {"tool": tool}
        if demand is not None:
            extra["agent_id"] = demand.agent
            extra["required"] = LEVEL_NAMES[demand.level]
        extra["client_id"] = client_id
        if access_for(call.spec).says_rejected:
            extra["result"] = "rejected"
            if call.arguments.get("lock") is True:
                extra["locked"] = False
        if detail is not None:
            extra["detail"] = detail
        log.warning(
            "ACL denial: client=%s tool=%s agent=%s required=%s",
            client_id,
            tool,
            extra.get("agent_id", "-"),
            extra.get("required", "-"),
        )
        # `error` is a code callers branch on; `detail` carries the explanation.
        return {"ok": False, "error": "permission_denied", **extra}


def _detail(tool: str, demand: Demand, demands: list[Demand], client: AclClient) -> str | None:
    """ACL-16: why a demand failed, unless the agent and level already say it."""
    if demand.agent != ALL or demand.how == "named":
        return None
    reach = _reach(client)
    if demand.how == "non_string":
        return f"non-string {demand.argument} argument resolved to the all-agents demand"
    if demand.how == "omitted":
        omitted = [d.argument for d in demands if d.how == "omitted" and d.argument]
        return (
            "no agent scope was sent, so the call resolved to the all-agents demand — pass "
            + " and ".join(dict.fromkeys(omitted))
            + " to scope it"
        )
    if demand.how == "star":
        return (
            f'{demand.argument} was sent as "*", so the call demands every agent at once — {reach}. '
            "Name a single agent to scope it"
        )
    return f"{demand.cause}; no agent scope narrows this call — it demands every agent by its nature, and {reach}"


def _reach(client: AclClient) -> str:
    if ALL not in client.grants:
        return "this client holds no all-agents grant, and named grants never add up to one"
    weakest = min(client.grants.values())
    holders = [agent for agent, level in client.grants.items() if level == weakest]
    return (
        f"a sweep is satisfied only at the weakest grant this client holds "
        f"({LEVEL_NAMES[weakest]} on {', '.join(holders)})"
    )
