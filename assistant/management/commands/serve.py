"""Serve the site with daphne, in one process or several on one port.

A daphne process is one event loop on one core: rendering the live pages for many sockets
can fill it. `--processes N` (WEB_PROCESSES) starts N daphne processes, each on its own
listening socket bound to the same address with SO_REUSEPORT, so the kernel spreads new
connections over them. A socket lives in one process; a worker's event reaches every
process's sockets through the channel layer, so several processes need Redis
(REDIS_URL): without it each process would see only its own group messages (the
conversations' pollers would still bring every event, late). With one process the
command simply becomes daphne.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

APPLICATION = "assistant.asgi:application"
# daphne through assistant/webserver.py (a named module: importing it here would install
# daphne's reactor in this process), before daphne's own arguments.
DAPHNE = [sys.executable, "-m", "assistant.webserver"]


class Command(BaseCommand):
    help = "Run daphne on HOST:PORT in --processes processes (several need REDIS_URL)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("WEB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("WEB_PORT", "8000")))
        parser.add_argument("--processes", type=int, default=int(os.environ.get("WEB_PROCESSES", "1")))

    def handle(self, *args, host: str, port: int, processes: int, **options):
        if processes <= 1:
            os.execv(sys.executable, [*DAPHNE, "-b", host, "-p", str(port), APPLICATION])
        if not settings.REDIS_URL:
            raise CommandError("Several web processes share their sockets' events through Redis: set REDIS_URL.")
        listeners = [_listener(host, port) for _ in range(processes)]
        children = [subprocess.Popen([*DAPHNE, "--fd", str(listener.fileno()), APPLICATION],
                                     pass_fds=[listener.fileno()]) for listener in listeners]
        for listener in listeners:
            listener.close()  # each child holds its own
        self.stdout.write(f"Serving on http://{host}:{port}/ in {processes} daphne processes "
                          f"({', '.join(str(child.pid) for child in children)})", ending="\n")
        self.stdout.flush()

        def forward(signum, frame):
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, forward)
        pid, status = os.wait()  # the first to end ends the rest: a supervisor restarts the whole
        forward(signal.SIGTERM, None)
        for child in children:
            if child.pid != pid:
                child.wait()
        raise SystemExit(os.waitstatus_to_exitcode(status))


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    listener.listen(512)
    listener.set_inheritable(True)
    return listener
