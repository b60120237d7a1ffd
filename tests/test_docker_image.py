"""The Dockerfile, built and run by a real docker daemon: stores and recalls over HTTP with the SDK's client.

Optional (marker ``docker``): skipped, with the reason, when no daemon answers or the base image
can neither be found nor pulled. ``CPERSONA_TEST_DOCKER_BASE`` names another base image (the build's
``BASE`` argument), e.g. one imported from a debootstrap tree where Docker Hub is out of reach.
The build reaches PyPI for the dependencies, as a user's build does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from test_http_transport import INIT, mcp_call, raw_post

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "python:3.12-slim"  # the Dockerfile's own default
TOKEN = "docker-test-" + uuid.uuid4().hex

pytestmark = pytest.mark.docker


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def _skip_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command here, so the image is untested here (docs/operations.md, Docker)"
    try:
        probe = docker("info", "--format", "{{.ServerVersion}}", timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "the docker daemon did not answer within 20 s; the image is untested here"
    if probe.returncode != 0:
        return f"no docker daemon answers ({probe.stderr.strip()[:200]}); the image is untested here"
    base = os.environ.get("CPERSONA_TEST_DOCKER_BASE", DEFAULT_BASE)
    if (
        docker("image", "inspect", base, check=False).returncode != 0
        and docker("pull", base, timeout=300, check=False).returncode != 0
    ):
        return f"the base image {base} is neither present nor pullable; set CPERSONA_TEST_DOCKER_BASE to a local one"
    return None


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if reason := _skip_reason():
        pytest.skip(reason)
    base = os.environ.get("CPERSONA_TEST_DOCKER_BASE", DEFAULT_BASE)
    tag = f"cpersona-server-test:{uuid.uuid4().hex[:12]}"
    # host networking: the build reaches PyPI the way this machine does (no bridge NAT needed)
    docker("build", "--network", "host", "--build-arg", f"BASE={base}", "-t", tag, str(ROOT), timeout=1200)
    yield tag
    docker("image", "rm", "-f", tag, check=False)


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"cpersona-test-{uuid.uuid4().hex[:12]}"
    docker("volume", "create", name)
    yield name
    docker("volume", "rm", "-f", name, check=False)


class Container:
    def __init__(self, image: str, volume: str, *extra: str) -> None:
        self.name = f"cpersona-test-{uuid.uuid4().hex[:12]}"
        docker(
            "run",
            "-d",
            "--name",
            self.name,
            "-p",
            "127.0.0.1::8402",
            "-v",
            f"{volume}:/data",
            "-e",
            f"CPERSONA_AUTH_TOKEN={TOKEN}",
            "-e",
            "CPERSONA_UPDATE_CHECK=false",
            "--health-interval",
            "2s",
            "--health-start-period",
            "60s",
            *extra,
            image,
        )
        port = docker("port", self.name, "8402/tcp").stdout.strip().splitlines()[0].rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}/mcp"

    def state(self, field: str) -> str:
        return docker("inspect", "-f", "{{" + field + "}}", self.name).stdout.strip()

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.state(".State.Health.Status")
            if status == "healthy":
                return
            if self.state(".State.Running") != "true":
                break
            time.sleep(1)
        raise AssertionError(f"container not healthy ({status}):\n{self.logs()}")

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


def test_the_image_serves_a_token_guarded_memory_kept_on_the_volume(image, volume):
    first = Container(image, volume)
    try:
        first.wait_healthy()
        assert docker("exec", first.name, "id", "-u").stdout.strip() == "10001"  # not root
        assert raw_post(first.url, {}, INIT).status_code == 401  # the token from the environment guards it
        stored = anyio.run(
            mcp_call,
            first.url,
            TOKEN,
            "store",
            {"agent_id": "dock", "content": "the container keeps its memory on the volume"},
        )
        assert stored["ok"] is True, stored
    finally:
        first.remove()

    second = Container(image, volume)  # a new container on the same volume sees the same database
    try:
        second.wait_healthy()
        found = anyio.run(mcp_call, second.url, TOKEN, "recall", {"agent_id": "dock", "query": "container"})
        assert [m["content"] for m in found["messages"]] == ["the container keeps its memory on the volume"], found
        listing = docker("exec", second.name, "ls", "-ln", "/data").stdout
        assert "cpersona.db" in listing and " 10001 " in listing
    finally:
        second.remove()


def test_without_a_token_the_container_refuses_to_start(image, volume):
    name = f"cpersona-test-{uuid.uuid4().hex[:12]}"
    try:
        done = docker(
            "run",
            "--name",
            name,
            "-v",
            f"{volume}:/data",
            "-e",
            "CPERSONA_UPDATE_CHECK=false",
            image,
            check=False,
            timeout=120,
        )
        assert done.returncode != 0
        assert "CPERSONA_AUTH_TOKEN" in done.stderr, done.stderr
    finally:
        docker("rm", "-f", name, check=False)
