"""OAuth protected-resource role (spec transport-and-config §6).

Discovery (RFC 9728): when a resource and at least one authorization server are
configured, the metadata document is served on its well-known path and every
401 names it. Otherwise nothing here is active and responses are those of a
build without the feature (OA-1).

Verification (OA-6..OA-9): in ACL mode a bearer credential that matched no
static token may be a JWT from one of the configured issuers. It is accepted
only when every check passes; any failure is a plain 401 with no reason given.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import jwt

from cpersona.mcp.acl import Principal

log = logging.getLogger(__name__)

WELL_KNOWN = "/.well-known/oauth-protected-resource"
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384")
KEYS_TTL_SECONDS = 3600.0
REFETCH_INTERVAL_SECONDS = 60.0
FETCH_LIMIT_BYTES = 256 * 1024
FETCH_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class OAuthConfig:
    resource: str
    authorization_servers: tuple[str, ...]
    scopes: tuple[str, ...] = ()
    jwks_uri: str | None = None

    @property
    def metadata_path(self) -> str:
        """OA-3: the well-known prefix plus the resource's path (``/`` adds nothing)."""
        path = urlsplit(self.resource).path
        return WELL_KNOWN + ("" if path in ("", "/") else path)

    @property
    def metadata_url(self) -> str:
        parts = urlsplit(self.resource)
        return f"{parts.scheme}://{parts.netloc}{self.metadata_path}"

    def metadata(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "resource": self.resource,
            "authorization_servers": list(self.authorization_servers),
        }
        if self.scopes:
            document["scopes_supported"] = list(self.scopes)
        document["bearer_methods_supported"] = ["header"]
        return document

    def challenge(self) -> str:
        """OA-5: the WWW-Authenticate value of every 401 while discovery is on."""
        value = f'Bearer resource_metadata="{self.metadata_url}"'
        if self.scopes:
            value += f', scope="{" ".join(self.scopes)}"'
        return value


def oauth_config(settings: Any) -> OAuthConfig | None:
    """The discovery configuration, or None while it is off (OA-1).

    URL and scope syntax were already checked when the settings were loaded.
    """
    resource = (settings.oauth_resource or "").strip()
    servers = tuple(settings.oauth_authorization_servers)
    if resource and not servers:
        log.warning(
            "CPERSONA_OAUTH_RESOURCE is set but CPERSONA_OAUTH_AUTHORIZATION_SERVERS lists no issuer; "
            "OAuth discovery stays off"
        )
    if not resource or not servers:
        return None
    jwks_uri = settings.oauth_jwks_uri
    if jwks_uri and len(servers) != 1:
        log.warning("CPERSONA_OAUTH_JWKS_URI is ignored: it applies only with exactly one authorization server")
        jwks_uri = None
    return OAuthConfig(resource, servers, tuple(settings.oauth_scopes), jwks_uri)


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _acceptable_key_url(url: str) -> bool:
    # OA-9 wants https. A plain-http key set on the loopback interface is
    # allowed too: nothing outside this machine can tamper with it, and it lets
    # a local issuer (and the test suite) run without certificates.
    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and _is_loopback(parts.hostname))


@dataclass
class _KeySet:
    keys: list[jwt.PyJWK]
    fetched_at: float
    last_refetch: float = 0.0


class TokenVerifier:
    """Checks a bearer JWT against the configured issuers (OA-7) and names its principal (OA-8)."""

    def __init__(self, config: OAuthConfig, clock: Any = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._keys: dict[str, _KeySet] = {}
        self._locks: dict[str, anyio.Lock] = {}

    async def verify(self, token: str) -> Principal | None:
        try:
            return await self._verify(token)
        except Exception as exc:  # noqa: BLE001 — any failure is a plain 401 (OA-7)
            log.info("OAuth token refused: %s", exc)
            return None

    async def _verify(self, token: str) -> Principal | None:
        if token.count(".") != 2:
            return None
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            return None
        unverified = jwt.decode(token, options={"verify_signature": False})
        issuer = unverified.get("iss")
        if not isinstance(issuer, str) or issuer not in self.config.authorization_servers:
            return None  # unknown issuer: refused before any network call
        key = await self._signing_key(issuer, header.get("kid"))
        if key is None:
            return None
        claims = jwt.decode(
            token,
            key.key,
            algorithms=[alg],
            audience=self.config.resource,
            issuer=issuer,
            options={"require": ["exp", "aud", "iss", "sub"]},
        )
        if "act" in claims:
            return None  # delegated tokens are not accepted
        client = claims.get("client_id") or claims.get("azp")
        subject = claims.get("sub")
        if not isinstance(client, str) or not client or not isinstance(subject, str):
            return None
        return Principal(f"oauth:{issuer}:{client}", issuer, subject)

    async def _signing_key(self, issuer: str, kid: Any) -> jwt.PyJWK | None:
        lock = self._locks.setdefault(issuer, anyio.Lock())
        async with lock:
            now = self._clock()
            cached = self._keys.get(issuer)
            if cached is None or now - cached.fetched_at > KEYS_TTL_SECONDS:
                cached = _KeySet(await self._fetch_keys(issuer), now, now)
                self._keys[issuer] = cached
            key = _pick(cached.keys, kid)
            if key is None and kid is not None and now - cached.last_refetch >= REFETCH_INTERVAL_SECONDS:
                # An unknown kid may be a rotated key: refetch, at most once a minute per issuer.
                cached.keys, cached.fetched_at, cached.last_refetch = await self._fetch_keys(issuer), now, now
                key = _pick(cached.keys, kid)
            return key

    async def _fetch_keys(self, issuer: str) -> list[jwt.PyJWK]:
        uri = self.config.jwks_uri or await self._discover_jwks_uri(issuer)
        if uri is None or not _acceptable_key_url(uri):
            log.warning("no usable key set for issuer %s", issuer)
            return []
        document = await _fetch_json(uri)
        keys = []
        for raw in document.get("keys", []) if isinstance(document, dict) else []:
            if not isinstance(raw, dict) or raw.get("use", "sig") != "sig":
                continue
            try:
                keys.append(jwt.PyJWK(raw))
            except jwt.PyJWKError:
                continue
        return keys

    async def _discover_jwks_uri(self, issuer: str) -> str | None:
        parts = urlsplit(issuer)
        origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
        for url in (
            f"{origin}/.well-known/oauth-authorization-server{path}",
            f"{origin}/.well-known/openid-configuration{path}",
            f"{origin}{path}/.well-known/openid-configuration",
        ):
            try:
                document = await _fetch_json(url)
            except Exception:  # noqa: BLE001 — try the next location
                continue
            if not isinstance(document, dict) or document.get("issuer") != issuer:
                continue  # a document for another issuer is ignored
            uri = document.get("jwks_uri")
            if isinstance(uri, str):
                return uri
        return None


def _pick(keys: list[jwt.PyJWK], kid: Any) -> jwt.PyJWK | None:
    if len(keys) == 1 and keys[0].key_id is None:
        return keys[0]  # a key without kid is usable only as the only key
    if kid is None:
        return keys[0] if len(keys) == 1 else None  # a kid-less token needs an unambiguous key set
    for key in keys:
        if key.key_id == kid:
            return key
    return None


async def _fetch_json(url: str) -> Any:
    """GET ``url`` within 10 s and 256 KiB (OA-9)."""
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as client:
        with anyio.fail_after(FETCH_TIMEOUT_SECONDS):
            async with client.stream("GET", url, headers={"Accept": "application/json"}) as response:
                response.raise_for_status()
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body.extend(chunk)
                    if len(body) > FETCH_LIMIT_BYTES:
                        raise ValueError(f"{url} answered more than {FETCH_LIMIT_BYTES} bytes")
    return json.loads(bytes(body))
