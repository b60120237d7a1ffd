"""Repositories: the SQL of one table family each, over a session the service opened.

A service opens the transaction (``app.db.read()`` / ``app.db.write()``) and
hands its session to a repository; the repository builds every statement, applies
the read scope once (cpersona.storage.scope) and chunks id lists under the
drivers' bound-parameter limits (:mod:`.base`). Services hold no SQL.

    memories       Memory rows: reads by id and scope, counters, flags
    episodes       Episode rows
    profiles       Profile rows
    associations   entities, aliases, mentions, relations
    nodes          record nodes (folders and their records)
    tasks          pending memory tasks
"""
