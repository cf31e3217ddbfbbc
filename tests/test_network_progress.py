"""The stall rule's network evidence (``supervise.tcp_queues`` / ``network_moved``) on real kernel
sockets, in a network namespace of their own: a hang's connections stand still (idle, or full towards
a peer that does not read), a lossy link's do not (the kernel resends what was dropped). Lab 09's
lossy-link notebook run is the same rule end to end."""
import json
import subprocess
import sys
import textwrap

import pytest

from ddplab.origins import cluster

pytestmark = pytest.mark.skipif(cluster.requirement() is not None, reason=str(cluster.requirement()))

SCRIPT = textwrap.dedent('''
    import json, socket, subprocess, time
    import psutil
    from ddplab.engine.supervise import network_moved, tcp_queues

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    me = psutil.Process()

    def pair():
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        client = socket.create_connection(srv.getsockname())
        server, _ = srv.accept()
        srv.close()
        return client, server

    def mine(sock):
        return tcp_queues(me).get(str(__import__("os").fstat(sock.fileno()).st_ino))

    def until(cond, limit_s=10.0):
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if cond():
                return True
            time.sleep(0.05)
        return False

    out = {}
    # a hang: connected, nothing in flight
    c1, s1 = pair()
    before = tcp_queues(me)
    time.sleep(0.3)
    out["idle"] = {"moved": network_moved(before, tcp_queues(me)), "queues": mine(c1)}

    # a peer that does not read: the sender fills its buffer and the peer's, then only zero-window probes
    c2, s2 = pair()
    c2.setblocking(False)
    try:
        while True:
            c2.send(b"x" * 65536)
    except BlockingIOError:
        pass
    def window_closed():      # both queues have stopped filling
        a = tcp_queues(me)
        time.sleep(0.1)
        return a == tcp_queues(me)
    settled = until(window_closed)
    before = tcp_queues(me)
    time.sleep(0.3)
    out["unread"] = {"moved": network_moved(before, tcp_queues(me)), "queues": mine(c2), "settled": settled}

    # a lossy link: every packet to the server's port dropped once connected; the kernel resends
    c3, s3 = pair()
    port = s3.getsockname()[1]
    subprocess.run(["nft", "add table inet loss"], check=True)
    subprocess.run(["nft", "add chain inet loss input { type filter hook input priority 0 ; }"], check=True)
    subprocess.run(["nft", f"add rule inet loss input tcp dport {port} drop"], check=True)
    c3.sendall(b"y" * 1000)
    before = tcp_queues(me)
    out["lossy"] = {"moved": until(lambda: network_moved(before, tcp_queues(me))), "queues": mine(c3)}
    print(json.dumps(out))
''')


@pytest.mark.timeout(60)
def test_a_hangs_sockets_stand_still_and_a_lossy_links_move():
    p = subprocess.run(["unshare", "-n", sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["idle"]["queues"] == [0, 0, 0] and not out["idle"]["moved"], out
    assert out["unread"]["settled"] and out["unread"]["queues"][0] > 0, out      # bytes the peer never took
    assert not out["unread"]["moved"], out
    # nothing acknowledged, so only the kernel's resending moved: the count of resends grew
    assert out["lossy"]["moved"] and out["lossy"]["queues"][0] == 1000 and out["lossy"]["queues"][2] >= 1, out
