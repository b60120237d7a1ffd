"""Embedding endpoint URLs: checking them, deriving sibling routes, reporting them safely.

A URL may carry credentials (userinfo) or tokens (query string). Anything that
leaves this module for a log line, an advisory or a health finding goes
through ``safe_endpoint`` so neither is ever echoed (spec ADV-4).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def safe_endpoint(url: str) -> str:
    """``scheme://host[:port]/path`` without userinfo, query or fragment."""
    if not url:
        return "<unset>"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        # A malformed port: still name the host part after any userinfo.
        try:
            parts = urlsplit(url)
        except ValueError:
            return "<unparsable>"
        host, port = parts.netloc.rpartition("@")[2], None
    if port:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")) or "<unparsable>"


def url_problem(url: str, variable: str) -> str | None:
    """Why no request can be sent to ``url``, or None when it looks usable."""
    if not url:
        return f"{variable} is not set"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        return f"{variable} is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"{variable} must start with http:// or https://"
    if not parts.hostname:
        return f"{variable} names no host"
    return None


def sibling_url(embed_url: str, route: str) -> str | None:
    """The route beside a URL ending in ``/embed`` (query kept), else None (spec EMB-6).

    Only an ``/embed`` URL has siblings this process can name; guessing a path
    for any other URL would send requests somewhere nobody configured.
    """
    try:
        parts = urlsplit(embed_url)
    except ValueError:
        return None
    path = parts.path.rstrip("/")
    if not path.endswith("/embed"):
        return None
    return urlunsplit(parts._replace(path=path[: -len("embed")] + route))


def redact(text: str, *urls: str) -> str:
    """``text`` with every given URL replaced by its safe form."""
    for url in urls:
        if url:
            text = text.replace(url, safe_endpoint(url))
    return text
