"""The network lab: nodes that really talk over a rate-limited card, nothing left behind (on success,
Ctrl-C or a killed owner), one sentence where it cannot run, and 07/06 taking the fallback path."""

import signal
import subprocess
import sys
import textwrap
import time

import nbformat
import papermill as pm
import pytest

from helpers import netlab, paths
from helpers.errors import CourseError

WHY_NOT = netlab.unavailable()
needs_lab = pytest.mark.skipif(WHY_NOT is not None, reason=f"network lab unavailable: {WHY_NOT}")


def test_switched_off_says_so_in_one_sentence(monkeypatch):
    monkeypatch.setenv(netlab.OFF_ENV, "off")
    why = netlab.unavailable()
    assert why == "COURSE_NETLAB=off is set, so the network lab is switched off."
    with pytest.raises(CourseError, match="switched off"):
        netlab.Lab(2)


def test_without_root_or_tools_says_what_is_missing(monkeypatch):
    monkeypatch.delenv(netlab.OFF_ENV, raising=False)
    monkeypatch.setattr(netlab.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netlab.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    assert "needs root (CAP_NET_ADMIN)" in netlab.unavailable()
    monkeypatch.setattr(netlab.shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    why = netlab.unavailable()
    assert "iproute2's tc" in why and why.endswith(".") and "\n" not in why


def test_bad_node_counts_and_rates_are_refused():
    with pytest.raises(CourseError, match="between 2 and 16 nodes"):
        netlab.Lab(1)


def test_burst_is_one_millisecond_of_traffic_between_64_and_256_kib():
    assert netlab.burst_bytes(100) == 64 * 1024
    assert netlab.burst_bytes(1500) == 187_500
    assert netlab.burst_bytes(8000) == 256 * 1024


@needs_lab
def test_two_nodes_talk_through_the_limited_card_and_leave_nothing():
    """1 MiB from node 1 to node 0 at 40 Mbit/s takes at least ~0.2 s, and node 1's card counts it."""
    server = "import socket; s = socket.socket(); s.bind(('0.0.0.0', 5000)); s.listen(); c, _ = s.accept(); n = 0\n" \
             "while (d := c.recv(65536)): n += len(d)\nprint(n)"  # fmt: skip
    client = "import socket, time; s = socket.create_connection(('10.213.0.1', 5000)); t = time.time()\n" \
             "s.sendall(b'x' * 2**20); s.close(); print(time.time() - t)"  # fmt: skip
    with netlab.Lab(2, rate_mbit=40) as lab:
        assert len(lab.leftovers()) == 3
        before = lab.bytes_sent(1)
        listener = subprocess.Popen(
            [*lab.prefix(0), sys.executable, "-c", server], stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.5)
        started = time.monotonic()
        subprocess.run([*lab.prefix(1), sys.executable, "-c", client], check=True, timeout=30)
        received = int(listener.communicate(timeout=30)[0])
        took = time.monotonic() - started
        sent = lab.bytes_sent(1) - before
        lab.set_rate(400)  # change on the fly
        assert "rate 400Mbit" in netlab.run_ip("tc", "qdisc", "show", "dev", netlab.CARD, ns=lab.names[0]).stdout
        with pytest.raises(CourseError, match="between 1 and 100000"):
            lab.set_rate(0)
        sleeper = subprocess.Popen([*lab.prefix(0), "sleep", "60"])
        for _ in range(100):  # on a loaded machine `ip netns exec` enters the namespace a moment later
            if str(sleeper.pid) in netlab.run_ip("ip", "netns", "pids", lab.names[0], check=False).stdout.split():
                break
            time.sleep(0.1)
        else:
            pytest.fail("the sleeper never entered node 0's namespace")
    assert received == 2**20 and sent >= 2**20
    assert took >= 0.8 * 2**20 * 8 / 40e6, took  # the card's rate, not loopback speed
    assert lab.leftovers() == []
    assert sleeper.wait(timeout=10) == -signal.SIGKILL  # processes inside the namespaces are stopped too


OWNER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from helpers import netlab
    with netlab.Lab(2, rate_mbit=100) as lab:
        print(" ".join([*lab.names, lab.switch]), flush=True)
        time.sleep(120)
    """
)


def start_owner():
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(root=str(paths.ROOT))], stdout=subprocess.PIPE, text=True
    )
    names = proc.stdout.readline().split()
    assert len(names) == 3, names
    assert set(names) <= set(netlab.namespaces())
    return proc, names


@needs_lab
def test_ctrl_c_removes_every_namespace():
    proc, names = start_owner()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert not set(names) & set(netlab.namespaces())


@needs_lab
def test_a_killed_owners_namespaces_are_removed_by_the_next_lab():
    proc, names = start_owner()
    proc.kill()
    proc.wait(timeout=30)
    assert set(names) <= set(netlab.namespaces()), "SIGKILL runs no clean-up"
    removed = netlab.remove_stale()
    assert set(names) <= set(removed)
    assert not set(names) & set(netlab.namespaces())


def cells_of(notebook: str, wanted) -> nbformat.NotebookNode:
    """A notebook made of some of ``notebook``'s cells (parameters first), to run one section alone."""
    nb = nbformat.read(paths.NOTEBOOKS / notebook, as_version=4)
    nb.cells = [c for c in nb.cells if c.id in wanted]
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
    return nb


@pytest.mark.parametrize(
    "notebook, cells, words",
    [
        (
            "07_two_nodes.ipynb",
            "c02 c03 c49e c49f c49g c49h c49i c49j c49k c49l c49m c49n",
            "The simulated wire of notebooks 04 and 05",
        ),
        ("06_ddp_in_practice.ipynb", "c02 c03 c05 c08c c09 c11 c25", "meet on 127.0.0.1"),
    ],
)
def test_without_the_lab_07_and_06_say_why_and_take_the_fallback(
    notebook, cells, words, tmp_path, monkeypatch
):
    monkeypatch.setenv(netlab.OFF_ENV, "off")
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    source = tmp_path / notebook
    nbformat.write(cells_of(notebook, cells.split()), source)
    done = pm.execute_notebook(str(source), str(tmp_path / "out.ipynb"), cwd=str(paths.NOTEBOOKS),
                               kernel_name="python3", progress_bar=False)  # fmt: skip
    text = "\n".join(o.get("text", "") for c in done.cells if c.cell_type == "code" for o in c.outputs)
    assert f"{netlab.OFF_ENV}=off is set" in text and words in text
    assert "ip netns exec" not in text
    if notebook.startswith("06"):
        assert "final weights against the one-node run's: largest difference 0 (allowed: 0)" in text
