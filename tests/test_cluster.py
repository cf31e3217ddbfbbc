"""ddplab.origins.cluster for real: namespaces, links, caps, firewall rules made and removed, and nothing left
after an exception, SIGTERM or SIGKILL (the next Cluster removes a dead owner's objects by name)."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from ddplab.origins import cluster
from ddplab.tools import system
from ddplab.origins.cluster import Cluster, Firewall

needs = pytest.mark.skipif(cluster.requirement() is not None, reason=str(cluster.requirement()))


def mine(run_id):
    """Every object of one run, by kind (empty lists when it is gone)."""
    objs = cluster.owned_objects()
    return {k: [n for n in v if cluster._run_id(n) == run_id] for k, v in objs.items()}


def gone(run_id):
    return not any(mine(run_id).values())


def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def test_firewall_rules_as_nftables_text():
    fw = Firewall(block_ports=(1024, 65535), allow_ports=(29400,), allow_from="10.213.0.0/24")
    text = fw.ruleset("ddplababcd")
    lines = [ln.strip() for ln in text.splitlines()]
    assert lines.index("ct state established,related accept") < lines.index("ip saddr 10.213.0.0/24 accept") \
        < lines.index("tcp dport 29400 accept") < lines.index('iifname != "lo" tcp dport 1024-65535 ct state new drop')
    lossy = Firewall(drop_percent=7).ruleset("t")
    assert 'numgen random mod 100 < 7 drop' in lossy and "established" not in lossy


def test_from_spec_reads_the_labs_network_entries():
    c = Cluster.from_spec({"nodes": 3, "rate_mbit": 100, "firewall": {"all": {"allow_ports": [29400],
                                                                             "allow_from": "cluster", "block_ports": [1024, 65535]}}})
    assert c.nodes == 3 and c.rate_mbit == 100 and set(c.firewall) == {0, 1, 2}
    assert c.firewall[2].allow_from == str(cluster.SUBNET) and c.firewall[0].block_ports == (1024, 65535)


@needs
def test_two_nodes_made_connected_and_removed():
    with Cluster(nodes=2, rate_mbit=50, firewall={1: Firewall(drop_percent=3)}, self_hosts="127.0.1.1") as c:
        objs = mine(c.run_id)
        assert sorted(objs["netns"]) == [f"ddplab-{c.run_id}-n0", f"ddplab-{c.run_id}-n1"]
        assert c.bridge in objs["link"] and len(objs["link"]) == 3
        n0, n1 = c.members
        assert "tbf" in sh("tc", "-n", n0.netns, "qdisc", "show", "dev", "eth0") and "rate 50Mbit" in \
            sh("tc", "-n", n0.netns, "qdisc", "show", "dev", "eth0")
        assert f"ddplab{c.run_id}" in sh("ip", "netns", "exec", n1.netns, "nft", "list", "tables")
        assert f"ddplab{c.run_id}" not in sh("nft", "list", "tables")          # the table lives in the node
        # its own hosts file and hostname: node 1 resolves itself to 127.0.1.1 and node 0 to its address
        out = sh(*n1.exec_prefix(), "sh", "-c", "hostname; getent hosts node1 node0")
        assert out.split()[:1] == ["node1"] and "127.0.1.1" in out and f"{n0.address}" in out
        # node 1 reaches node 0 over the bridge
        server = subprocess.Popen(["ip", "netns", "exec", n0.netns, sys.executable, "-c",
                                   "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                                   f"s.bind(('{n0.address}',5999));s.listen();print('up',flush=True);c,_=s.accept();c.sendall(b'hi')"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up"
            got = sh("ip", "netns", "exec", n1.netns, sys.executable, "-c",
                     f"import socket;s=socket.create_connection(('{n0.address}',5999),timeout=10);print(s.recv(2))")
            assert "hi" in got
        finally:
            server.kill()
            server.wait()
    assert gone(c.run_id)
    assert f"ddplab-{c.run_id}" not in sh("ip", "netns", "list")


@needs
def test_an_exception_inside_tears_down():
    with pytest.raises(RuntimeError):
        with Cluster(nodes=2) as c:
            assert mine(c.run_id)["netns"]
            raise RuntimeError("boom")
    assert gone(c.run_id)


CHILD = ("import sys,time\nfrom ddplab.origins.cluster import Cluster, Firewall\n"
         "with Cluster(nodes=2, rate_mbit=100, firewall={0: Firewall(block_ports=(1024, 65535))}) as c:\n"
         "    print(c.run_id, flush=True)\n    time.sleep(120)\n")


def _child():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    run_id = p.stdout.readline().strip()
    assert run_id and mine(run_id)["netns"], "the child did not make its cluster"
    return p, run_id


@needs
def test_sigterm_tears_down():
    p, run_id = _child()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert gone(run_id)


@needs
def test_sigkill_leaves_objects_that_the_next_start_removes():
    p, run_id = _child()
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    left = mine(run_id)
    assert left["netns"] and left["link"] and left["owner"], "SIGKILL cannot tear down: the objects stay"
    assert set(left["netns"]) <= set(cluster.leftovers().get("netns", []))
    with Cluster(nodes=2) as c:
        assert gone(run_id), f"the next start left the killed run's objects: {mine(run_id)}"
        assert mine(c.run_id)["netns"]
    assert gone(c.run_id)
    for text in (sh("ip", "netns", "list"), sh("ip", "link"), sh("nft", "list", "tables")):
        assert f"ddplab-{run_id}" not in text and f"ddplab{run_id}" not in text and f"ddplab{c.run_id}" not in text


@needs
def test_live_owners_objects_are_kept():
    p, run_id = _child()
    try:
        cluster.cleanup()
        assert mine(run_id)["netns"], "cleanup removed a cluster whose owner is alive"
        assert not set(mine(run_id)["netns"]) & set(cluster.leftovers().get("netns", []))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    assert gone(run_id)


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="lab 09 is Linux only")
TOOLS = {t: system.PACKAGE[t] for t in system.PARTS["labs"][1]}   # lab 09's tools -> their packages


def _path_without(tmp_path, missing):
    """A PATH holding every tool lab 09 needs but ``missing`` (stand-ins: only their presence is read)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        if tool not in missing:
            (folder / tool).write_text("#!/bin/sh\nexit 1\n")
            (folder / tool).chmod(0o755)
    return str(folder)


@linux_only
@pytest.mark.parametrize("missing", ["nft", "tc", "unshare"])
def test_requirement_names_the_missing_tool_and_its_install_command(monkeypatch, tmp_path, missing):
    from ddplab.errors import DdplabError
    monkeypatch.setenv("PATH", _path_without(tmp_path, {missing}))
    why = cluster.requirement()
    assert why == system.Need(missing, f"apt-get install {TOOLS[missing]}")
    with pytest.raises(DdplabError) as e:
        Cluster(nodes=2).__enter__()
    assert f"apt-get install {TOOLS[missing]}" in str(e.value)


@linux_only
def test_requirement_names_root_when_only_root_is_missing(monkeypatch, tmp_path):
    from ddplab.errors import DdplabError
    monkeypatch.setenv("PATH", _path_without(tmp_path, set()))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = str(cluster.requirement())
    assert "root" in why and "apt-get" not in why
    with pytest.raises(DdplabError, match="root"):
        Cluster(nodes=2).__enter__()


@linux_only
def test_requirement_on_this_machine_names_what_it_lacks():
    """Whatever this machine lacks (nothing, a tool, root), the one line names it."""
    lacks = [t for t in TOOLS if shutil.which(t) is None]
    why = cluster.requirement()
    if lacks:
        assert str(why) == f"needs {lacks[0]}: apt-get install {TOOLS[lacks[0]]}"
    elif os.geteuid() != 0:
        assert why is not None and "root" in str(why)
    else:
        assert why is None
