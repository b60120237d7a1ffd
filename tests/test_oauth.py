"""OAuth protected-resource role (spec transport-and-config §6): discovery and token verification.

The authorization server is a real HTTP server on 127.0.0.1 publishing its
metadata and key set; tokens are RS256/ES256 JWTs signed with keys made here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from cpersona.config import load_settings
from cpersona.mcp.acl import Principal
from cpersona.mcp.oauth import OAuthConfig, TokenVerifier, oauth_config
from test_http_transport import INIT, HttpServer, auth, mcp_call, raw_post

pytestmark = pytest.mark.anyio

RESOURCE = "https://memory.example.com/mcp"


class Issuer:
    """A minimal authorization server: RFC 8414 metadata and a JWKS, counting requests."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {"k1": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
        self.published = ["k1"]
        self.hits: list[str] = []
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                issuer.hits.append(self.path)
                if self.path == "/.well-known/oauth-authorization-server":
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks"}
                elif self.path == "/jwks":
                    body = {"keys": [issuer.jwk(kid) for kid in issuer.published]}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def jwk(self, kid: str) -> dict[str, Any]:
        key = self.keys[kid].public_key()
        algorithm = (
            jwt.algorithms.ECAlgorithm if isinstance(key, ec.EllipticCurvePublicKey) else jwt.algorithms.RSAAlgorithm
        )
        return {**json.loads(algorithm.to_jwk(key)), "kid": kid, "use": "sig"}

    def token(self, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
        body = {"iss": self.url, "sub": "user-1", "aud": RESOURCE, "exp": int(time.time()) + 600, "client_id": "app1"}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.keys[kid], algorithm=alg, headers={"kid": kid})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    yield server
    server.close()


# --- the switch and discovery ---------------------------------------------------------


def config_from(**env: str) -> OAuthConfig | None:
    return oauth_config(load_settings({f"CPERSONA_{k.upper()}": v for k, v in env.items()}))


def test_discovery_needs_a_resource_and_an_issuer(caplog):  # spec OA-1
    assert config_from() is None
    assert config_from(oauth_authorization_servers="https://auth.example.com") is None
    assert config_from(oauth_resource=RESOURCE) is None
    assert "lists no issuer" in caplog.text
    on = config_from(oauth_resource=RESOURCE, oauth_authorization_servers="https://a.example, https://b.example")
    assert on is not None and on.authorization_servers == ("https://a.example", "https://b.example")


def test_metadata_path_and_challenge():  # spec OA-3, OA-5
    config = OAuthConfig(RESOURCE, ("https://auth.example.com",), ("memory.read", "memory.write"))
    assert config.metadata_path == "/.well-known/oauth-protected-resource/mcp"
    assert config.metadata_url == "https://memory.example.com/.well-known/oauth-protected-resource/mcp"
    assert config.challenge() == (
        'Bearer resource_metadata="https://memory.example.com/.well-known/'
        'oauth-protected-resource/mcp", scope="memory.read memory.write"'
    )
    root = OAuthConfig("https://memory.example.com/", ("https://auth.example.com/",))
    assert root.metadata_path == "/.well-known/oauth-protected-resource"
    assert (
        root.challenge() == 'Bearer resource_metadata="https://memory.example.com/.well-known/oauth-protected-resource"'
    )
    assert root.metadata() == {
        "resource": "https://memory.example.com/",
        "authorization_servers": ["https://auth.example.com/"],
        "bearer_methods_supported": ["header"],
    }  # published as configured (OA-4)


def test_discovery_on_serves_metadata_without_credentials(tmp_path):  # spec OA-3..OA-5, AUTH-4
    server = HttpServer(
        tmp_path,
        CPERSONA_AUTH_TOKEN="t0k",
        CPERSONA_OAUTH_RESOURCE=RESOURCE,
        CPERSONA_OAUTH_AUTHORIZATION_SERVERS="https://auth.example.com https://login.example.org",
        CPERSONA_OAUTH_SCOPES="memory.read,memory.write",
    )
    try:
        path = server.root + "/.well-known/oauth-protected-resource/mcp"
        document = httpx.get(path)
        assert document.status_code == 200
        assert document.json() == {
            "resource": RESOURCE,
            "authorization_servers": ["https://auth.example.com", "https://login.example.org"],
            "scopes_supported": ["memory.read", "memory.write"],
            "bearer_methods_supported": ["header"],
        }
        refused = raw_post(server.url, {}, INIT)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == (
            'Bearer resource_metadata="https://memory.example.com/.well-known/oauth-protected-resource/mcp", '
            'scope="memory.read memory.write"'
        )
        assert httpx.post(path).status_code == 401  # only GET is public (OA-4)
        assert httpx.get(server.root + "/.well-known/other").status_code == 401
        assert "verification stays off without CPERSONA_ACL_FILE" in server.log()  # OA-6
        assert raw_post(server.url, auth("t0k"), INIT).status_code == 200
    finally:
        server.stop()


def test_discovery_off_answers_exactly_as_without_the_feature(tmp_path):  # spec OA-1
    answers = []
    for env in ({}, {"CPERSONA_OAUTH_RESOURCE": RESOURCE}):
        server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN="t0k", **env)
        try:
            for response in (
                raw_post(server.url, {}, INIT),
                httpx.get(server.root + "/.well-known/oauth-protected-resource/mcp"),
            ):
                headers = {k: v for k, v in response.headers.items() if k != "date"}
                answers.append((response.status_code, response.content, headers))
        finally:
            server.stop()
    assert answers[:2] == answers[2:]
    assert answers[0][0] == 401 and answers[0][2]["www-authenticate"] == "Bearer"


# --- verification ---------------------------------------------------------------------


def verifier_for(issuer: Issuer, **kw: Any) -> TokenVerifier:
    return TokenVerifier(OAuthConfig(RESOURCE, (issuer.url,), **kw))


async def test_a_valid_token_names_a_namespaced_principal(issuer):  # spec OA-7, OA-8
    verifier = verifier_for(issuer)
    principal = await verifier.verify(issuer.token())
    assert principal == Principal(f"oauth:{issuer.url}:app1", issuer.url, "user-1")
    via_azp = await verifier.verify(issuer.token(client_id=None, azp="app2"))
    assert via_azp.client_id == f"oauth:{issuer.url}:app2"
    ec_key = ec.generate_private_key(ec.SECP256R1())
    issuer.keys["e1"] = ec_key
    issuer.published.append("e1")
    verifier = verifier_for(issuer)
    assert (await verifier.verify(issuer.token(kid="e1", alg="ES256"))).subject == "user-1"


async def test_every_failed_check_is_a_refusal(issuer):  # spec OA-7
    verifier = verifier_for(issuer)
    stranger_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(
        {"iss": issuer.url, "sub": "u", "aud": RESOURCE, "exp": int(time.time()) + 60, "client_id": "app1"},
        stranger_key,
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    bad = {
        "another resource": issuer.token(aud="https://other.example.com/mcp"),
        "trailing slash": issuer.token(aud=RESOURCE + "/"),
        "expired": issuer.token(exp=int(time.time()) - 60),
        "no exp": issuer.token(exp=None),
        "no sub": issuer.token(sub=None),
        "delegated": issuer.token(act={"sub": "agent"}),
        "no client": issuer.token(client_id=None),
        "forged": forged,
        "symmetric": jwt.encode(
            {"iss": issuer.url, "sub": "u", "aud": RESOURCE, "exp": int(time.time()) + 60, "client_id": "app1"},
            "k" * 32,
            algorithm="HS256",
        ),
        "not a jwt": "opaque-access-token",
    }
    for name, token in bad.items():
        assert await verifier.verify(token) is None, name


async def test_an_unknown_issuer_is_refused_without_a_network_call(issuer):  # spec OA-7
    verifier = verifier_for(issuer)
    foreign = jwt.encode(
        {"iss": "https://evil.example", "sub": "u", "aud": RESOURCE, "exp": int(time.time()) + 60, "client_id": "x"},
        issuer.keys["k1"],
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    assert await verifier.verify(foreign) is None
    assert issuer.hits == []


async def test_keys_are_cached_and_a_new_kid_refetches_at_most_once_a_minute(issuer):  # spec OA-9
    now = [1000.0]
    verifier = TokenVerifier(OAuthConfig(RESOURCE, (issuer.url,)), clock=lambda: now[0])
    assert await verifier.verify(issuer.token()) is not None
    assert await verifier.verify(issuer.token()) is not None
    assert issuer.hits.count("/jwks") == 1  # cached
    issuer.keys["k2"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer.published.append("k2")
    assert await verifier.verify(issuer.token(kid="k2")) is None  # fetched < 60 s ago: no refetch yet
    now[0] += 61
    assert await verifier.verify(issuer.token(kid="k2")) is not None  # rotated key found
    assert issuer.hits.count("/jwks") == 2


async def test_verified_clients_get_their_grants_over_http(tmp_path, issuer):  # spec ACL-8, OA-6, OA-8
    acl = tmp_path / "acl.json"
    acl.write_text(
        json.dumps(
            {
                "clients": [
                    {"client_id": f"oauth:{issuer.url}:app1", "token": None, "grants": {"alice": "read-write"}},
                    {"client_id": "static", "token": "static-token", "grants": {"*": "read"}},
                ]
            }
        )
    )
    os.chmod(acl, 0o600)
    server = HttpServer(
        tmp_path,
        CPERSONA_ACL_FILE=str(acl),
        CPERSONA_OAUTH_RESOURCE=RESOURCE,
        CPERSONA_OAUTH_AUTHORIZATION_SERVERS=issuer.url,
    )
    try:
        stored = await mcp_call(server.url, issuer.token(), "store", {"agent_id": "alice", "content": "via oauth"})
        assert stored["ok"] is True
        denied = await mcp_call(server.url, issuer.token(), "store", {"agent_id": "bob", "content": "x"})
        assert denied["client_id"] == f"oauth:{issuer.url}:app1" and denied["error"] == "permission_denied"
        unprovisioned = await mcp_call(
            server.url, issuer.token(client_id="app9"), "list_memories", {"agent_id": "alice"}
        )
        assert unprovisioned["detail"].startswith("this client has no entry in the ACL grant table")  # ACL-9
        listed = await mcp_call(server.url, "static-token", "list_memories", {"agent_id": "alice"})
        assert [m["content"] for m in listed["memories"]] == ["via oauth"]
        wrong_audience = raw_post(server.url, auth(issuer.token(aud="https://elsewhere.example/mcp")), INIT)
        assert wrong_audience.status_code == 401
        assert wrong_audience.headers["www-authenticate"].startswith('Bearer resource_metadata="')
    finally:
        server.stop()
