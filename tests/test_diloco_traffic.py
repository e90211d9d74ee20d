"""``TcpTraffic``: the kernel's per-socket TCP byte counters for a process tree (what the DiLoCo workers report as
``tcp_bytes_sent``), against connections whose bytes are known."""

import socket
import subprocess
import sys
import time

import pytest

from swarmrl.diloco.traffic import TcpTraffic

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc are Linux's")

_PEER = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
got = 0
while got < 123457:
    got += len(s.recv(65536))
s.sendall(b"x" * 777)
s.recv(1)
"""


def test_tcp_traffic_counts_what_a_process_tree_sent_and_received():
    srv = socket.create_server(("127.0.0.1", 0))
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(srv.getsockname()[1])])
    try:
        theirs, ours = TcpTraffic(peer.pid), TcpTraffic()
        assert theirs.sample() is not None and ours.sample() is not None
        conn, _ = srv.accept()
        conn.sendall(b"y" * 123457)
        got = b""
        while len(got) < 777:
            got += conn.recv(1000)
        deadline = time.monotonic() + 10
        while (c := theirs.sample()).sent < 777 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the kernel's payload counters of the peer's socket: exactly what it sent and received
        assert (c.sent, c.received) == (777, 123457)
        # our tree holds both ends of that connection (the peer is our child): not traffic between workers
        mine = ours.sample()
        assert (mine.sent, mine.received) == (0, 0)
        conn.sendall(b"!")
        assert peer.wait(timeout=30) == 0
    finally:
        if peer.poll() is None:
            peer.kill()
        srv.close()


def test_tcp_traffic_keeps_the_bytes_of_a_closed_connection():
    srv = socket.create_server(("127.0.0.1", 0))
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(srv.getsockname()[1])])
    try:
        theirs = TcpTraffic(peer.pid)
        theirs.sample()
        conn, _ = srv.accept()
        conn.sendall(b"y" * 123457)
        while len(conn.recv(1000)) == 0:
            pass
        deadline = time.monotonic() + 10
        while theirs.sample().sent < 777 and time.monotonic() < deadline:
            time.sleep(0.05)
        conn.sendall(b"!")
        assert peer.wait(timeout=30) == 0
        after = theirs.sample()  # the peer and its socket are gone: what was sampled before stays counted
        assert (after.sent, after.received) == (777, 123457)
    finally:
        if peer.poll() is None:
            peer.kill()
        srv.close()
