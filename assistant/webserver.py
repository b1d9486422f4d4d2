"""daphne, with a close handshake a slow client can finish: `python -m assistant.webserver`
takes daphne's own arguments (`manage.py serve` runs it).

The live page learns why its socket closed from the close frame's code (4403: not yours or
signed out, 4429: too many live pages; static/js/live.js). After sending that frame,
daphne's WebSocket layer (autobahn) waits one second for the client's answer and then
resets the connection. A client slower than that (a phone on a poor link, a browser on a
loaded machine) can have the reset arrive before it has read the frame, and its page then
reports 1006, "connection lost", and retries where it should say why. That is the likely
story of a browser test on a loaded CI machine that once got 1006 where 4403 was sent:
daphne logged the socket's end a second after it closed it, the reset's timing.
`CLOSE_HANDSHAKE_SECONDS` gives the client the time daphne already gives it to open the
socket."""

from __future__ import annotations

from daphne.cli import CommandLineInterface
from daphne.server import Server

CLOSE_HANDSHAKE_SECONDS = 5


class WebServer(Server):
    def listen_success(self, port):
        # daphne makes its WebSocket factory in `run`, just before it listens.
        self.ws_factory.setProtocolOptions(closeHandshakeTimeout=CLOSE_HANDSHAKE_SECONDS)
        super().listen_success(port)


class WebServerCommand(CommandLineInterface):
    server_class = WebServer


if __name__ == "__main__":
    WebServerCommand.entrypoint()
