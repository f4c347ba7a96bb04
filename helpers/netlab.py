"""A network lab (网络实验室): nodes on one machine as network namespaces joined by a rate-limited link.

A network lab (网络实验室): N "nodes" on one machine, each a Linux network namespace with its own address,
its own network card (a veth pair into a shared bridge, the "switch") and a rate limit on that card, so
that torchrun runs once per node and DDP's traffic crosses a real, slow link.

It needs root (CAP_NET_ADMIN), ``ip`` and ``tc`` (iproute2), and the kernel's tbf queue. :func:`unavailable`
says in one sentence when that is missing; the notebooks then use the simulated wire instead. Every
namespace is named ``dpc<pid>-...`` after the process that made it; :meth:`Lab.close` removes the
namespaces (and with them their links) and the processes inside them, on success, on error and on Ctrl-C, and a new Lab first removes what a crashed kernel left behind.
Only addresses inside these namespaces are used (10.213.0.0/24); the machine's own network is untouched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from helpers.errors import CourseError

PREFIX = "dpc"  # every namespace the lab makes starts with this, then the pid of the process that made it
SUBNET = "10.213.0"  # node k is 10.213.0.(k + 1); the switch has no address
CARD = "eth0"  # the node's network card inside its namespace; gloo is told to use it
OFF_ENV = "COURSE_NETLAB"  # set to "off" to take the simulated-wire path even where the lab could run


def run_ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (`ip`, `tc`, ...) on the host or, with ``ns``, inside that network namespace."""
    argv = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise CourseError(
            f"the network lab could not run `{' '.join(argv)}`: {done.stderr.strip() or done.returncode}"
        )
    return done


def namespaces() -> list[str]:
    """The lab's namespaces on this machine now (made by any process)."""
    if not shutil.which("ip"):
        return []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX) and n[len(PREFIX) :].split("-")[0].isdigit()]


def _owner(name: str) -> int:
    return int(name[len(PREFIX) :].split("-")[0])


def _remove(name: str) -> None:
    """Stop every process in namespace ``name`` and delete it (its links go with it)."""
    pids = run_ip("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    for _ in range(50):  # a killed process leaves the namespace a moment later
        if run_ip("ip", "netns", "delete", name, check=False).returncode == 0 or name not in namespaces():
            break
        time.sleep(0.1)


def remove_stale() -> list[str]:
    """Remove the namespaces of lab owners that are no longer running (a kernel that was killed)."""
    stale = []
    for name in namespaces():
        try:
            os.kill(_owner(name), 0)
        except ProcessLookupError:
            stale.append(name)
        except PermissionError:
            pass
    for name in stale:
        _remove(name)
    return stale


def unavailable() -> str | None:
    """None when the lab can run here; otherwise one sentence saying why not."""
    if os.environ.get(OFF_ENV, "").lower() in ("0", "off", "no", "false"):
        return f"{OFF_ENV}=off is set, so the network lab is switched off."
    missing = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    if missing:
        return f"the network lab needs iproute2's {' and '.join(missing)} (apt install iproute2), which this machine lacks."
    if os.geteuid() != 0:
        return "the network lab needs root (CAP_NET_ADMIN) to make network namespaces, and this kernel runs as a normal user."
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        made = run_ip("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"this machine refuses to make a network namespace ({made.stderr.strip()}), so the network lab cannot run."
        run_ip("ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1", ns=probe, check=False)
        tbf = run_ip(
            "tc",
            "qdisc",
            "add",
            "dev",
            "p0",
            "root",
            "tbf",
            "rate",
            "100mbit",
            "burst",
            "64kb",
            "latency",
            "50ms",
            ns=probe,
            check=False,
        )
        if tbf.returncode != 0:
            return f"this kernel has no token-bucket queue (tc tbf: {tbf.stderr.strip()}), so the lab cannot limit a link's rate."
    finally:
        _remove(probe)
    return None


def burst_bytes(rate_mbit: float) -> int:
    """The token bucket's depth: 1 ms of traffic at the rate, kept between 64 KiB (one offloaded packet)
    and 256 KiB (so that a message of 1 MiB or more cannot pass mostly as one burst)."""
    return min(256 * 1024, max(64 * 1024, int(rate_mbit * 1e6 / 8 / 1000)))


class Lab:
    """``nodes`` network namespaces joined by a switch, each node's card limited to ``rate_mbit``.

    Use as ``with Lab(2, rate_mbit=1000) as lab:``; node k has address ``lab.address(k)``, a command runs
    inside it behind ``lab.prefix(k)``, and ``lab.env()`` tells gloo which card to use.
    """

    def __init__(self, nodes: int = 2, rate_mbit: float = 1000):
        if not 2 <= nodes <= 16:
            raise CourseError(f"nodes={nodes!r}: the lab makes between 2 and 16 nodes.")
        why = unavailable()
        if why:
            raise CourseError(why)
        remove_stale()
        self.nodes = nodes
        self.rate_mbit = None
        tag = f"{PREFIX}{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self.switch = f"{tag}-switch"
        self.names = [f"{tag}-node{k}" for k in range(nodes)]
        try:
            self._build()
            self.set_rate(rate_mbit)
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        run_ip("ip", "netns", "add", self.switch)
        run_ip("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
        run_ip("ip", "link", "set", "br0", "up", ns=self.switch)
        for k, name in enumerate(self.names):
            run_ip("ip", "netns", "add", name)
            port = f"port{k}"
            run_ip(
                "ip",
                "link",
                "add",
                CARD,
                "netns",
                name,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            run_ip("ip", "link", "set", port, "master", "br0", ns=self.switch)
            run_ip("ip", "link", "set", port, "up", ns=self.switch)
            run_ip("ip", "addr", "add", f"{self.address(k)}/24", "dev", CARD, ns=name)
            run_ip("ip", "link", "set", CARD, "up", ns=name)
            run_ip("ip", "link", "set", "lo", "up", ns=name)

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def prefix(self, node: int) -> list[str]:
        """What goes in front of a command to run it on ``node``."""
        return ["ip", "netns", "exec", self.names[node]]

    @staticmethod
    def env() -> dict:
        """Environment for a process on a node: gloo must use the node's card, not loopback."""
        return {"GLOO_SOCKET_IFNAME": CARD}

    def set_rate(self, rate_mbit: float) -> None:
        """Limit every node's outgoing traffic to ``rate_mbit`` megabits per second (a token bucket)."""
        if not (isinstance(rate_mbit, int | float) and 1 <= rate_mbit <= 100_000):
            raise CourseError(f"rate_mbit={rate_mbit!r}: give a link rate between 1 and 100000 Mbit/s.")
        verb = "add" if self.rate_mbit is None else "change"
        for name in self.names:
            run_ip(
                "tc",
                "qdisc",
                verb,
                "dev",
                CARD,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit:g}mbit",
                "burst",
                str(burst_bytes(rate_mbit)),
                "latency",
                "50ms",
                ns=name,
            )
        self.rate_mbit = rate_mbit

    def bytes_sent(self, node: int) -> int:
        """Bytes node ``node``'s card has sent so far (the kernel's own counter)."""
        out = run_ip("cat", f"/sys/class/net/{CARD}/statistics/tx_bytes", ns=self.names[node]).stdout
        return int(out.strip())

    def leftovers(self) -> list[str]:
        """This lab's namespaces that still exist (none once :meth:`close` has run)."""
        present = set(namespaces())
        return [n for n in [*self.names, self.switch] if n in present]

    def close(self) -> None:
        """Remove every namespace of this lab, its links, the processes in it and its files."""
        for name in [*getattr(self, "names", []), getattr(self, "switch", None)]:
            if name:
                _remove(name)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Lab({self.nodes} nodes at {self.rate_mbit:g} Mbit/s: "
            + ", ".join(f"node{k} {self.address(k)}" for k in range(self.nodes))
            + ")"
        )
