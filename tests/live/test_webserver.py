"""`manage.py serve` runs daphne through assistant/webserver.py: a client slow to answer the
close frame that tells its page why (4403 here) gets the time to answer it, where plain
daphne resets the connection after one second."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from urllib.parse import urlsplit

import pytest

from assistant.consumers import FORBIDDEN
from assistant.webserver import CLOSE_HANDSHAKE_SECONDS
from tests.support.processes import serving

pytestmark = pytest.mark.slow

SLOW_ANSWER_SECONDS = 2  # autobahn's own close handshake allows 1 s


def test_a_client_slow_to_answer_the_close_frame_is_given_the_time(tmp_path):
    assert CLOSE_HANDSHAKE_SECONDS > SLOW_ANSWER_SECONDS
    with serving(tmp_path / "serve.log") as (url, _), _signed_out_socket(url) as client:
        assert _close_code(client) == FORBIDDEN
        time.sleep(SLOW_ANSWER_SECONDS)
        client.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing to read: not reset (ConnectionResetError)
            client.recv(1, socket.MSG_PEEK)
        client.sendall(_masked_close(FORBIDDEN))  # the answer, which ends the handshake


def _signed_out_socket(url: str) -> socket.socket:
    """A WebSocket opened by hand (no library answers the close frame for us)."""
    host = urlsplit(url).netloc
    client = socket.create_connection((urlsplit(url).hostname, urlsplit(url).port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    client.sendall(f"GET /ws/conversations/1/ HTTP/1.1\r\nHost: {host}\r\nOrigin: {url}\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    return client


def _close_code(client: socket.socket) -> int:
    """The code of the close frame that follows the 101 response."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < 4:
        chunk = client.recv(4096)
        assert chunk, data
        data += chunk
    head, _, frame = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    assert frame[0] == 0x88, frame  # FIN + close, unmasked from the server
    return struct.unpack("!H", frame[2:4])[0]


def _masked_close(code: int) -> bytes:
    mask = os.urandom(4)
    payload = struct.pack("!H", code)
    return bytes([0x88, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
