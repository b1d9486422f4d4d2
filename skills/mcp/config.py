"""Which MCP servers exist and who may use them: the admin's rows and the settings file.

A deployment lists servers in a JSON file (ASSISTANT_MCP_SERVERS_FILE, read into
settings.ASSISTANT_MCP_SERVERS); staff add more in the admin. A name in both is the
admin's. The list is read at most every ASSISTANT_MCP_CONFIG_SECONDS per process, so
building a prompt costs no query; saving a server in the admin forgets it at once in
that process (the others follow within those seconds).

Secrets stay in the environment: a server names variables, whose values are read here,
when a connection opens, and never stored or shown.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from skills.mcp.models import NAME


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    name: str
    description: str = ""
    transport: str = "stdio"  # or "http"
    command: str = ""
    args: tuple[str, ...] = ()
    url: str = ""
    env_names: tuple[str, ...] = ()
    header_env: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float = 30.0
    trust_read_only: bool = False
    write_policy: str = "ask"
    everyone: bool = False
    user_ids: frozenset[int] = frozenset()
    usernames: frozenset[str] = frozenset()
    group_ids: frozenset[int] = frozenset()
    group_names: frozenset[str] = frozenset()

    @property
    def domain(self) -> str:
        return f"mcp.{self.name}"

    @property
    def key(self) -> str:
        """What a connection depends on: a changed command, URL or variable opens a new one."""
        reach = [self.transport, self.command, list(self.args), self.url, list(self.env_names), list(self.header_env)]
        return f"{self.name}:{hashlib.sha256(json.dumps(reach).encode()).hexdigest()[:12]}"

    def environment(self) -> dict[str, str]:
        """The stdio server's environment: a minimal one (PATH, HOME, LANG) and the named
        variables, so the worker's own secrets do not leak to a server not named for them."""
        base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV")
                if name in os.environ}
        return base | {name: os.environ[name] for name in self.env_names if name in os.environ}

    def headers(self) -> dict[str, str]:
        return {header: os.environ[variable] for header, variable in self.header_env if variable in os.environ}

    def allows(self, user) -> bool:
        if self.everyone:
            return True
        if user is None or not getattr(user, "pk", None):
            return False
        if user.pk in self.user_ids or user.get_username() in self.usernames:
            return True
        if self.group_ids or self.group_names:
            return any(g.pk in self.group_ids or g.name in self.group_names for g in _groups_of(user))
        return False


class ConfigError(ValueError):
    pass


def from_setting(entry: dict) -> ServerConfig:
    """One server of settings.ASSISTANT_MCP_SERVERS; ConfigError says what is wrong."""
    if not isinstance(entry, dict):
        raise ConfigError(f"an MCP server must be an object, not {entry!r}")
    name = entry.get("name", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"MCP server name {name!r}: lower-case letters, digits and _, starting with a letter")
    known = {"name", "description", "transport", "command", "args", "url", "env", "headers", "timeout_seconds",
             "trust_read_only", "write_policy", "everyone", "users", "groups"}
    if unknown := set(entry) - known:
        raise ConfigError(f"MCP server {name}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    transport = entry.get("transport", "stdio" if "command" in entry else "http")
    if transport not in ("stdio", "http"):
        raise ConfigError(f"MCP server {name}: transport is 'stdio' or 'http'")
    if transport == "stdio" and not entry.get("command"):
        raise ConfigError(f"MCP server {name}: a stdio server needs a command")
    if transport == "http" and not entry.get("url"):
        raise ConfigError(f"MCP server {name}: an http server needs a url")
    if entry.get("write_policy", "ask") not in ("allow", "ask", "deny"):
        raise ConfigError(f"MCP server {name}: write_policy is allow, ask or deny")
    return ServerConfig(
        name=name, description=str(entry.get("description", ""))[:300], transport=transport,
        command=str(entry.get("command", "")), args=tuple(map(str, entry.get("args", []))),
        url=str(entry.get("url", "")), env_names=tuple(map(str, entry.get("env", []))),
        header_env=tuple(sorted((str(k), str(v)) for k, v in dict(entry.get("headers", {})).items())),
        timeout_seconds=float(entry.get("timeout_seconds", 30.0)),
        trust_read_only=bool(entry.get("trust_read_only", False)), write_policy=entry.get("write_policy", "ask"),
        everyone=bool(entry.get("everyone", False)), usernames=frozenset(map(str, entry.get("users", []))),
        group_names=frozenset(map(str, entry.get("groups", []))),
    )


def settings_problems() -> list[str]:
    """What is wrong with settings.ASSISTANT_MCP_SERVERS, one sentence each."""
    entries = settings.ASSISTANT_MCP_SERVERS
    if not isinstance(entries, list):
        return ["it must hold a JSON list of servers"]
    problems, names = [], set()
    for entry in entries:
        try:
            config = from_setting(entry)
        except (ConfigError, TypeError, ValueError) as exc:
            problems.append(str(exc))
            continue
        if config.name in names:
            problems.append(f"MCP server {config.name} is listed twice")
        names.add(config.name)
    return problems


def _from_row(row) -> ServerConfig:
    return ServerConfig(
        name=row.name, description=row.description, transport=row.transport, command=row.command,
        args=tuple(row.args or ()), url=row.url, env_names=tuple(row.env_names or ()),
        header_env=tuple(sorted((row.header_env or {}).items())), timeout_seconds=row.timeout_seconds,
        trust_read_only=row.trust_read_only, write_policy=row.write_policy, everyone=row.everyone,
        user_ids=frozenset(u.pk for u in row.users.all()), group_ids=frozenset(g.pk for g in row.groups.all()),
    )


_lock = threading.Lock()
_cached: tuple[float, dict[str, ServerConfig]] | None = None


def servers() -> dict[str, ServerConfig]:
    """Every enabled server by name (settings first, the admin's rows over them)."""
    global _cached
    with _lock:
        if _cached is not None and time.monotonic() - _cached[0] < settings.ASSISTANT_MCP_CONFIG_SECONDS:
            return _cached[1]
    from skills.mcp.models import McpServer

    found = {config.name: config for config in map(from_setting, settings.ASSISTANT_MCP_SERVERS)}
    rows = McpServer.objects.filter(enabled=True).prefetch_related("users", "groups")
    found |= {row.name: _from_row(row) for row in rows}
    with _lock:
        _cached = (time.monotonic(), found)
    return found


def servers_for(user) -> list[ServerConfig]:
    return [config for name, config in sorted(servers().items()) if config.allows(user)]


def forget() -> None:
    """Read the servers again at the next look (a server saved in the admin, a test)."""
    global _cached
    with _lock:
        _cached = None


def _groups_of(user) -> list:
    cached = getattr(user, "_mcp_groups", None)
    if cached is None:
        cached = list(user.groups.all())
        user._mcp_groups = cached
    return cached
