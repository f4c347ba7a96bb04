"""Reaping: a process whose parent died comes back to the runner, which finds and stops it."""

import subprocess
import sys

# In a process of its own: a subreaper keeps every orphan below it for the rest of its life.
ORPHAN = r"""
import os, subprocess, sys, time
import psutil
from course import reap

assert reap.adopt_orphans()
parent = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen(['sleep', '60'], start_new_session=True); print(p.pid)"],
    stdout=subprocess.PIPE, text=True)
orphan = int(parent.stdout.readline())
parent.wait()  # its parent is gone; its own session would have left it to init
deadline = time.monotonic() + 10
while psutil.Process(orphan).ppid() != os.getpid() and time.monotonic() < deadline:
    time.sleep(0.05)
print("adopted", psutil.Process(orphan).ppid() == os.getpid())
print("named", reap.described([psutil.Process(orphan)]))
print("stopped", reap.stop_children())
print("gone", not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE)
"""


def test_an_orphan_comes_back_to_the_runner_which_names_and_stops_it():
    done = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["adopted True", "named sleep 60", "stopped 1", "gone True"], done.stdout
