"""Remote vector mode, as the services use it (spec EMB-6, ST-6, DE-2, DAD-2).

``CPERSONA_VECTOR_SEARCH_MODE=remote`` hands vector search to the embedding
service's own index (``cpersona.embedding.remote``). This module is the one
place the services meet it:

- ``near_list``: recall's vector channel from a remote answer. The index only
  knows the namespace (the agent), so every id it names is hydrated through
  the search backend's ``fetch`` — the same scope predicates
  (``cpersona.storage.scope``) and source filter every local arm applies — and
  whatever is not visible there (another project or channel, another source,
  a deleted row, an id this database never had) is dropped, never shown.
- ``push`` after a write commits (store, update, archive), ``forget`` after a
  delete, ``purge`` after an agent's data is gone. Failures are logged by the
  client and tolerated: the database row is the record, the index a copy.

Network calls never run under the write lock: callers call these after their
transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cpersona.embedding.client import EmbedOutcome
from cpersona.services.app import App
from cpersona.services.records.backfill import on_query_embedded
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.search import MAX_QUERY_CHARS, Hit, SearchBackend
from cpersona.storage.scope import Scope

# -- recall ------------------------------------------------------------------------------


def near_list(
    app: App,
    backend: SearchBackend,
    *,
    agent_id: str,
    text: str,
    scope: Scope,
    source_id: str,
    episodes_apply: bool,
    depth: int,
    threshold: float,
    measure: bool = True,
) -> list[Hit] | None:
    """The vector channel's list from the remote index, or None to fall back to the local scan.

    None when there is no remote index or it gave no usable answer (404,
    timeout, malformed body); the caller then embeds the query and scans
    locally, which finds what local blobs exist. An answer — even an empty
    one — replaces the local scan, and no far list is read (EMB-6, VEC-7).
    """
    index = app.remote_index
    if index is None or depth <= 0:
        return None
    answer = index.search(agent_id, text[:MAX_QUERY_CHARS], depth, threshold)
    if not answer.ok:
        return None
    if measure:
        # ADV-2: a remote-search answer counts as healthy.
        recovered = app.embedding_health.observe(EmbedOutcome(True, True))
        on_query_embedded(app, recovered=recovered)
    wanted = [hit for hit in answer.hits or [] if hit.score >= threshold and (hit.kind == "mem" or episodes_apply)]
    if not wanted:
        return []
    # Isolation: only rows the scope (and the source filter, for memories) can see survive.
    visible = backend.fetch(scope, [hit.key for hit in wanted], source_id=source_id)
    hits = [Hit(visible[hit.key], hit.score) for hit in wanted if hit.key in visible]
    hits.sort(key=lambda hit: -(hit.raw or 0.0))  # stable: the service's order breaks ties
    return hits[:depth]


# -- writes ------------------------------------------------------------------------------


def push(app: App, agent_id: str, items: Sequence[tuple[str, str]]) -> bool:
    """Index ``(ref, text)`` pairs of one agent after commit; True when the service took them."""
    index = app.remote_index
    if index is None or not items:
        return False
    return index.index(agent_id, items)


def push_rows(app: App, keys: Iterable[tuple[str, int]]) -> int:
    """Push rows by key with their current text, per owner (health repairs, H-6); how many were taken.

    Reads the rows after the caller's commit, so a row deleted meanwhile is simply not sent.
    """
    if app.remote_index is None:
        return 0
    wanted: dict[str, list[int]] = {"mem": [], "ep": []}
    for kind, row_id in keys:
        wanted[kind].append(int(row_id))
    by_agent: dict[str, list[tuple[str, str]]] = {}
    with app.db.read() as session:
        for kind, repository in (("mem", MemoryRepository), ("ep", EpisodeRepository)):
            for row_id, agent_id, text in repository(session).texts(wanted[kind]):
                by_agent.setdefault(agent_id, []).append((f"{kind}:{row_id}", text))
    return sum(len(items) for agent_id, items in by_agent.items() if push(app, agent_id, items))


def forget(app: App, agent_id: str, refs: Sequence[str]) -> bool:
    """Remove deleted rows' vectors from the agent's namespace (failure logged only)."""
    index = app.remote_index
    if index is None or not refs:
        return False
    return index.remove(agent_id, refs)


def forget_rows(app: App, rows: Iterable[tuple[str, int, str]]) -> None:
    """Remove deleted rows given as (kind, id, owner), one request per owner (health repairs, H-6)."""
    by_agent: dict[str, list[str]] = {}
    for kind, row_id, agent_id in rows:
        by_agent.setdefault(agent_id, []).append(f"{kind}:{row_id}")
    for agent_id, refs in by_agent.items():
        forget(app, agent_id, sorted(refs))


def purge(app: App, agent_id: str) -> bool:
    """Drop the agent's whole namespace (delete_agent_data, DAD-2; failure logged only)."""
    index = app.remote_index
    return index.purge(agent_id) if index is not None else False
