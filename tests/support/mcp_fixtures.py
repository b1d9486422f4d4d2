"""Helpers for tests of MCP skills: the test server (tests/support/mcp_server.py) as an
admin row over stdio, or as its own process over streamable HTTP, and fresh sessions."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")


@pytest.fixture
def mcp_sessions(settings, tmp_path, monkeypatch):
    """No cached servers, tool lists or sessions before or after; the test server writes
    its effects under tmp_path."""
    from skills.mcp import client as mcp_client
    from skills.mcp import config as mcp_config

    settings.ASSISTANT_MCP_CONFIG_SECONDS = 0
    settings.ASSISTANT_MCP_RETRY_SECONDS = 0
    settings.SKILLS_WORKSPACE_ROOT = tmp_path / "workspaces"
    monkeypatch.setenv("MCP_TEST_DIR", str(tmp_path))
    mcp_config.forget()
    mcp_client.reset()
    yield tmp_path
    mcp_client.reset()
    mcp_config.forget()


def stdio_server(name: str = "tools", **fields):
    """An admin row for the test server over stdio (for everyone unless told)."""
    from skills.mcp.models import McpServer

    fields = {"everyone": True, "timeout_seconds": 5, "env_names": ["MCP_TEST_DIR"], **fields}
    return McpServer.objects.create(name=name, transport="stdio", command=sys.executable, args=[SERVER], **fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http_server(directory: Path) -> tuple[str, subprocess.Popen]:
    """The test server over streamable HTTP, in its own process: (url, process)."""
    port = free_port()
    log_path = directory / "mcp-http.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, SERVER, "--http", f"127.0.0.1:{port}"], stdout=log,
                                   stderr=log, env={"MCP_TEST_DIR": str(directory), "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}/mcp", process
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
