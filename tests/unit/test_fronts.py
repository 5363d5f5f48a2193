"""Front processes' readiness share and their SO_REUSEPORT sockets (the processes themselves:
tests/functional/test_pooled_server.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket

import pytest

from fnserve.server.fronts import AllListening, balanced, reuse_port_socket


def test_ready_once_every_front_process_listened_and_after_one_is_replaced() -> None:
    listening = multiprocessing.get_context("spawn").Value("i", 0)
    first, second = AllListening(listening, 2), AllListening(listening, 2)
    asyncio.run(first.start())
    assert not first() and not second()  # one of two listens: connections would all go to it
    asyncio.run(second.start())
    assert first() and second()
    asyncio.run(second.stop())  # it exits; the supervisor replaces it, the first serves on
    assert first() and listening.value == 1
    replacement = AllListening(listening, 2)
    assert not replacement()  # not counted in yet, and it never saw all listening
    asyncio.run(replacement.start())
    assert replacement()


@pytest.mark.skipif(not balanced(), reason="SO_REUSEPORT balances connections on Linux only")
def test_sockets_with_reuse_port_share_a_port_and_each_takes_connections() -> None:
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)
    held = reuse_port_socket("127.0.0.1", port)  # the supervisor's: bound, never listening
    with first, second, held:
        first.listen()
        second.listen()
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        try:
            first.setblocking(False)
            second.setblocking(False)
            accepted = {"first": 0, "second": 0}
            for name, server in (("first", first), ("second", second)):
                while True:
                    try:
                        conn, _ = server.accept()
                    except BlockingIOError:
                        break
                    conn.close()
                    accepted[name] += 1
            # Every connection reached a listening socket (none the bound one), spread by the kernel's hash:
            # all 32 on one side would happen once in 2**31.
            assert accepted["first"] + accepted["second"] == 32
            assert accepted["first"] and accepted["second"], accepted
        finally:
            for client in clients:
                client.close()
        with pytest.raises(OSError):  # a socket without SO_REUSEPORT cannot take the port from them
            plain = socket.socket()
            try:
                plain.bind(("127.0.0.1", port))
            finally:
                plain.close()
