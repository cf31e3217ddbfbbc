"""The classroom's JupyterHub, as `make classroom` runs it (tested by tests/test_hub.py; docs/instructor.md).

    make classroom LEARNERS=8                 # as root: accounts, this hub, the URL and the accounts printed
    jupyterhub -f classroom/jupyterhub_config.py   # by hand, with the DDPLAB_HUB_* variables below

- Authentication: PAM, one Unix account per learner (`ddplab classroom hub` makes them, each with its own
  password, home 0700, shell nologin): a learner's processes run under their own uid and their files are
  theirs alone, so nobody reads, kills or deletes another's notebook, kernel, job or runs.
- Spawner: JupyterHub's LocalProcessSpawner (the default) runs each learner's server as that account, with
  the workbook installed once for all (the repository's .venv: jupyterhub-singleuser, JupyterLab, ddplab).
- Each server's environment as docs/instructor.md says: OMP_NUM_THREADS=1 (N jobs on the cores, not N times
  every core), DDPLAB_RUNS_DIR in the learner's home, no MASTER_PORT (every ddplab run asks for a free port),
  and the fix-its' reference solution withheld (DDPLAB_FIXIT_REFERENCE=0): the instructor hands it out.
- Listens on 127.0.0.1 unless the instructor says otherwise (DDPLAB_HUB_IP, `--ip`); the hub's own API and
  configurable-http-proxy's API on other loopback ports.
"""
import os
import pwd
import sys
from pathlib import Path

from ddplab.tools import hub      # the classroom's defaults live there, once

c = get_config()  # noqa: F821  (JupyterHub's config loader provides it)

env = os.environ.get
VENV = Path(env("DDPLAB_HUB_VENV", sys.prefix))
STATE = Path(env(hub.MARK, hub.STATE))
LEARNERS = {n for n in env("DDPLAB_HUB_LEARNERS", "").split(",") if n}

# where the hub listens (the learners' URL), its own API and the proxy's API: loopback unless told
c.JupyterHub.ip = env("DDPLAB_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(env("DDPLAB_HUB_PORT", hub.PORT))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(env("DDPLAB_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('DDPLAB_HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [env("DDPLAB_HUB_PROXY", "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
# the hub's stop (Ctrl-C) stops every learner's server and the proxy (the launcher then checks that no
# process of any learner is left)
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True

# one Unix account per learner, PAM passwords
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = LEARNERS
c.PAMAuthenticator.open_sessions = False

# the instructor's API token (the launcher's, for starting servers and collecting work)
if env("DDPLAB_HUB_API_TOKEN"):
    c.JupyterHub.services = [{"name": "ddplab-instructor", "api_token": env("DDPLAB_HUB_API_TOKEN")}]
    c.JupyterHub.load_roles = [{"name": "admin", "services": ["ddplab-instructor"]}]

# each learner's server: the workbook's own JupyterLab, as that learner
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = f"~/{hub.NOTEBOOKS_DIR}"
# a loaded machine (every learner pressing Start at once) starts servers slowly: wait, do not give up
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300


def _home(spawner) -> str:
    return pwd.getpwnam(spawner.user.name).pw_dir


# OMP_NUM_THREADS=1 and DDPLAB_RUNS_DIR=$HOME/ddplab-runs (hub.server_env: what `ddplab classroom check`
# is asked about too), and the fix-its' reference solution withheld
c.Spawner.environment = {
    **{k: (lambda spawner, k=k: hub.server_env(_home(spawner))[k]) for k in hub.server_env("~")},
    "DDPLAB_FIXIT_REFERENCE": env("DDPLAB_FIXIT_REFERENCE", "0"),
}
