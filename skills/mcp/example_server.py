"""A small MCP server to try MCP skills with: notes kept in one JSON file.

    python -m skills.mcp.example_server                      # stdio (the worker starts it)
    python -m skills.mcp.example_server --http 127.0.0.1:8765  # streamable HTTP at /mcp

Two tools: `search_notes` (read-only, and says so) and `add_note` (changes the file).
The file is MCP_NOTES_FILE, or var/mcp-notes.json beside manage.py. Written with the
official SDK's server side, like any server a user already runs.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

NOTES = Path(os.environ.get("MCP_NOTES_FILE") or Path(__file__).resolve().parents[2] / "var" / "mcp-notes.json")

server = MCPServer("notes", instructions="A shared notebook.")


def _notes() -> list[dict]:
    try:
        return json.loads(NOTES.read_text())
    except FileNotFoundError:
        return []


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def search_notes(query: str = "") -> list[dict]:
    """Notes whose text contains the query (all notes without one), newest first."""
    return [note for note in reversed(_notes()) if query.lower() in note["text"].lower()][:20]


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def add_note(text: str) -> dict:
    """Add a note to the notebook."""
    notes = _notes()
    note = {"id": len(notes) + 1, "text": text[:2000], "at": datetime.now(UTC).isoformat(timespec="seconds")}
    NOTES.parent.mkdir(parents=True, exist_ok=True)
    temporary = NOTES.with_suffix(".partial")
    temporary.write_text(json.dumps(notes + [note], indent=1))
    temporary.replace(NOTES)
    return note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp")
    options = parser.parse_args()
    if options.http:
        host, _, port = options.http.rpartition(":")
        server.run("streamable-http", host=host or "127.0.0.1", port=int(port))
    else:
        server.run()


if __name__ == "__main__":
    main()
