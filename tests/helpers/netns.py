"""Network namespaces for tests of load sent from several machines: each "machine" is a
namespace with its own address on a bridge this helper creates (root needed; nothing leaves
the host). Names carry a per-process suffix, so tests running at once do not collide, and
everything is deleted by name on the way out, whatever happened."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Fleet", "fleet", "why_not"]


@dataclass(frozen=True)
class Fleet:
    bridge_ip: str  # the host's address on the bridge (coordinator and server bind it)
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]  # each namespace's own address

    def exec(self, i: int) -> list[str]:
        """The command prefix that runs a program inside namespace ``i``."""
        return ["ip", "netns", "exec", self.namespaces[i]]


def why_not() -> str | None:
    """Why namespaces cannot be made here (a reason to skip), or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"llprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def fleet(n: int) -> Iterator[Fleet]:
    """``n`` namespaces on a new bridge, in a /24 of 10.213.0.0/16 picked by process id."""
    tag = os.getpid() % 250
    bridge, net = f"llbr{tag}", f"10.213.{tag}"
    names = tuple(f"ll{tag}w{i}" for i in range(n))
    addresses = tuple(f"{net}.{10 + i}" for i in range(n))
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{net}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            host_end, ns_end = f"ll{tag}h{i}", f"ll{tag}n{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("link", "set", host_end, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addresses[i]}/24", "dev", ns_end)
            _ip("-n", ns, "link", "set", ns_end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield Fleet(f"{net}.1", names, addresses)
    finally:
        for ns in names:  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
