"""Skills from MCP servers (Model Context Protocol), through the official `mcp` SDK.

- models.py: McpServer, a server staff configured in the admin;
- config.py: the servers (the admin's and the settings file's) and who may use each;
- client.py: the process's sessions, on one event loop thread;
- skills.py: a server's tools as the domain `mcp.<server>`, and their results;
- example_server.py: a small notes server to try it with (`python -m skills.mcp.example_server`).

The registry (skills/registry.py) asks `domains_for(user)` for the domains a user may
use; a server that is down is a domain with `unavailable` set, not an error.
"""

from __future__ import annotations

import threading

from skills.base import Domain

_built: dict[str, tuple[list, object, Domain]] = {}  # (the listing it was built from, kept alive; its config)
_built_lock = threading.Lock()


def domains_for(user) -> dict[str, Domain]:
    """The MCP domains `user` may use, by name; nothing is started for a user with none."""
    from skills.mcp.config import servers_for

    configs = servers_for(user)
    if not configs:
        return {}
    from skills.mcp.client import ServerDown, hub
    from skills.mcp.skills import domain_of, down_domain

    found = {}
    for config in configs:
        try:
            tools = hub().tools(config)
        except ServerDown as exc:
            found[config.domain] = down_domain(config, str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - no server can break the catalogue
            found[config.domain] = down_domain(config, f"{type(exc).__name__}: {exc}")
            continue
        with _built_lock:  # the same listing gives the same Domain (and byte-stable prompts)
            built = _built.get(config.name)
            if built is None or built[0] is not tools or built[1] != config:
                built = _built[config.name] = (tools, config, domain_of(config, tools))
        found[config.domain] = built[2]
    return found
