"""The store the ranks talk to, listening only where it is asked to.

Why a socket of our own: ``TCPStore(host, port, is_master=True)`` listens on
every interface whatever ``host`` says (``host`` is only where its own client
connects). A store bound to the loopback address, handed over as
``master_listen_fd``, cannot be reached from another machine unless the user
names an interface (multi-node).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host`` (an address, or an interface name) and ``port``."""
    address = interface_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(1024)
    return sock


def interface_address(host: str) -> str:
    """An interface name (``eth0``) -> its first IPv4 address; anything else as is."""
    import psutil

    for addr in psutil.net_if_addrs().get(host, []):
        if addr.family == socket.AF_INET:
            return addr.address
    return host


def host_store(host: str = "127.0.0.1", port: int = 0,
               timeout_s: float = 30.0) -> tuple[Any, socket.socket]:
    """A master ``TCPStore`` listening on ``host`` only, and its socket (close it
    after dropping the store)."""
    import torch.distributed as dist

    sock = listen_socket(host, port)
    address, bound = sock.getsockname()[:2]
    store = dist.TCPStore(address, bound, None, True, timedelta(seconds=timeout_s),
                          wait_for_workers=False, master_listen_fd=sock.fileno())
    return store, sock
