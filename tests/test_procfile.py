"""`make run`'s process runner (assistant/procfile.py, honcho over the Procfile): a Ctrl-C
gives each process its graceful stop, past honcho's own 5 s, and ends with status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import honcho.compat
import honcho.manager
from django.conf import settings

from assistant import procfile

# A Procfile process that takes 6 s to stop (more than honcho's 5 s), as a worker draining.
SLOW_STOP = textwrap.dedent("""
    import signal, sys, time
    def stop(*args):
        time.sleep(6)
        print("drained", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("slow process up", flush=True)
    time.sleep(60)
""")


def test_honcho_still_has_what_the_runner_replaces():
    assert isinstance(honcho.manager.KILL_WAIT, (int, float))
    assert callable(honcho.compat.ProcessManager.terminate)


def test_the_wait_covers_the_workers_drain():
    assert procfile.kill_wait() > settings.ASSISTANT_RUNNER_DRAIN_SECONDS


def test_ctrl_c_is_a_clean_end_and_a_failure_is_not():
    assert procfile.exit_status(procfile.CTRL_C_STATUS) == 0
    assert procfile.exit_status(1) == 1


def test_sigterm_goes_to_the_process_not_its_group():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        procfile.terminate_process(None, child.pid)
        assert child.wait(timeout=10) == -signal.SIGTERM
        procfile.terminate_process(None, child.pid)  # already gone: no error
    finally:
        child.kill()


def test_ctrl_c_waits_for_a_slow_stop_and_exits_0(tmp_path: Path):
    (tmp_path / "slow.py").write_text(SLOW_STOP)
    (tmp_path / "Procfile").write_text(f"slow: exec {sys.executable} {tmp_path / 'slow.py'}\n")
    runner = subprocess.Popen(
        [sys.executable, "-m", "assistant.procfile", "-f", str(tmp_path / "Procfile"), "--no-colour"],
        cwd=settings.BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
    )
    try:
        assert "slow process up" in _read_until(runner, "slow process up")
        os.killpg(runner.pid, signal.SIGINT)  # a Ctrl-C reaches the runner's group
        output, _ = runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert runner.returncode == 0, output
    assert "drained" in output and "SIGKILL" not in output, output


def _read_until(process: subprocess.Popen, word: str, timeout: float = 60) -> str:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if word in line or not line:
            break
    return "".join(seen)
