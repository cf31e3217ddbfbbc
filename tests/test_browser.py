"""What a learner's browser shows: JupyterLab, driven by a real chromium through Python Playwright.

- Notebook 00: run all cells, the widget panel renders, Run starts a real job, the live status line
  shows each rank while it runs, and the result then has one line per rank
  (build/browser-00_start_here.png).
- ``%%ddplab``: a cell that is a real 2-rank job shows its live status line, the kernel is
  interrupted from JupyterLab's Kernel menu while it runs, the job is ended with nothing left, and
  the same kernel then runs the next ``%%ddplab`` cell to its verdict (build/browser-ddplab-magic.png).
- The stored notebook 01, opened as a learner opens it: the hang's timeline is there as a picture
  (build/browser-01-timeline.png).

Playwright's own browser download does not work everywhere (not here), so the test uses Debian's
chromium (`apt-get install chromium`; `.ci/run` installs it) and skips with one line where there is
none. JupyterLab and every job it started are ended afterwards, and checked gone.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from ddplab.tools import system

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "00_start_here.ipynb"
SHOT = ROOT / "build" / "browser-00_start_here.png"
MAGIC_SHOT = ROOT / "build" / "browser-ddplab-magic.png"
CHROMIUM = system.where("chromium")          # $DDPLAB_CHROMIUM, else chromium on PATH
NEED = system.missing(["chromium"])
# Upper limits for waiting on a selector (ms): the page answers as soon as the selector is there;
# these only end a test whose page never shows it. Cells start real jobs on a loaded 2-core machine.
PAGE_MS = 120_000
CELLS_MS = 300_000

playwright = pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed (pip install -e '.[test]')")
pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (pip install -e '.[test]')")
pytestmark = [
    pytest.mark.browser, pytest.mark.multiprocess, pytest.mark.timeout(600),
    pytest.mark.skipif(bool(NEED), reason=f"the browser test {NEED[0] if NEED else ''}"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end(proc: subprocess.Popen) -> None:
    """End JupyterLab and everything it started (its own session: the kernel, the kernel's jobs)."""
    try:
        tree = [proc, *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = [proc]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, alive = psutil.wait_procs([p for p in tree if not isinstance(p, subprocess.Popen)], timeout=10)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        alive.append(proc)
    for p in alive:
        try:
            p.kill()
        except (psutil.Error, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on a free port with a token, no browser of its own, in a folder holding a copy of
    notebook 00; its runs go to the session's runs folder (DDPLAB_RUNS_DIR, set by conftest)."""
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    # JupyterLab 4 renders only the cells in view (windowing); a test that looks for the panel
    # below them needs them all. No news pop-up over the page either.
    settings = tmp_path / "lab-settings" / "@jupyterlab"
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}')
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path / "jupyterlab.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"), "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
             "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime")})
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(proc, f"{base}/api/status?token={token}", tmp_path / "jupyterlab.log")
        yield base, token, tmp_path
    finally:
        _end(proc)
        log.close()


def _wait_for_server(proc, url, logfile) -> None:
    """Poll the server's status API until it answers (it is ready) or the process has exited."""
    import time
    while True:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}: {logfile.read_text()[-800:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)


def _failed_shot(page, shot: Path) -> None:
    """What the page showed when a wait gave up, for whoever reads the failure: ``<shot>-failed.png``."""
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot.with_name(shot.stem + "-failed.png")), full_page=True)


def _open_and_run_all(page, url: str) -> None:
    """Open the notebook at ``url``, wait for its kernel, press Run All Cells."""
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=PAGE_MS)
    if page.locator(".jp-Dialog", has_text="Error Loading Theme").count():
        # a loaded CI machine (CI at 592547c): the server did not deliver the theme's stylesheet
        # in time and JupyterLab left its error dialog up, with no status bar. Load the page again.
        page.reload()
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=PAGE_MS)
    # the kernel is connected when the status bar names it idle (the toolbar's indicator says
    # idle before the kernel is there, and Run All then does nothing)
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=PAGE_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def test_notebook_00_panel_runs_in_a_real_browser(jupyterlab, session_runs_dir):
    base, token, _ = jupyterlab
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _open_and_run_all(page, f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")

            # the widget panel renders: its title, the variant picker and the Run button
            run_button = page.locator(".jp-OutputArea button.jupyter-button", has_text="Run")
            run_button.first.wait_for(state="visible", timeout=CELLS_MS)
            page.locator(".jp-OutputArea .widget-html", has_text="Lab 01").first.wait_for(timeout=PAGE_MS)
            assert page.locator(".jp-OutputArea .widget-dropdown select").count() >= 1
            # every cell ran (each prompt has its number), none with an error
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                        .every(p => /\\[\\d+\\]/.test(p.textContent))""", timeout=CELLS_MS)
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                                has_text="Traceback").count() == 0

            run_button.first.click()
            # the live status line, seen while the job runs: the button says running... and the line
            # names both ranks at the same moment (grouped when they are in the same state: "ranks 0-1: ...")
            page.wait_for_function(
                """() => {
                    const busy = [...document.querySelectorAll('.jp-OutputArea button.jupyter-button')]
                        .some(b => b.textContent.includes('running'));
                    const line = [...document.querySelectorAll('.jp-OutputArea .widget-html code')]
                        .map(c => c.textContent).find(t => / s \\| (rank 0: .*rank 1: |ranks 0-1: )/.test(t));
                    return busy && line !== undefined;
                }""", timeout=PAGE_MS)
            live = page.locator(".jp-OutputArea .widget-html code", has_text=" s | rank").first.inner_text()
            # then the result: the button is back, and the result table has one line per group of ranks
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-OutputArea button.jupyter-button')]
                        .some(b => b.textContent.trim() === 'Run' && !b.disabled)""", timeout=CELLS_MS)
            table = page.locator(".jp-OutputArea .widget-output table").last
            table.wait_for(timeout=PAGE_MS)
            ranks = [row.locator("td").first.inner_text().strip() for row in table.locator("tr").all()[1:]]
            verdict = page.locator(".jp-OutputArea .widget-output b").first.inner_text()
            SHOT.parent.mkdir(parents=True, exist_ok=True)
            table.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOT), full_page=False)
        except Exception:
            _failed_shot(page, SHOT)
            raise
        finally:
            browser.close()

    assert re.search(r" s \| (rank 0: .*rank 1: |ranks 0-1: )", live), live
    assert sorted(ranks) == ["0", "1"], ranks        # one row per group of ranks; lab 01's broken ranks differ
    # the panel starts on lab 01's first variant: the learner sees the verdict the catalog expects of it
    from ddplab.origins import catalog
    assert verdict == catalog.find_lab("01").variants[0].expect.upper(), verdict
    assert SHOT.stat().st_size > 10_000
    from conftest import assert_nothing_left
    assert_nothing_left(str(session_runs_dir))


# The %%ddplab notebook: a job that only an interrupt ends (its ranks make no progress, and the stall
# window is longer than the test), a cell that shows the kernel still answers, and a job that ends ok.
SPIN = """%%ddplab --nproc 2 --stall 900 --name spin
import time
import torch.distributed as dist
dist.init_process_group("gloo")
while True:                      # waits for ever: only the interrupt ends it
    time.sleep(0.1)
"""
AFTER = 'print("after the interrupt:", spin.status.value if spin is not None else None)'
OK = """%%ddplab --nproc 2 --name done
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("sum", int(t.item()))
dist.destroy_process_group()
"""


def _magic_notebook(folder: Path) -> str:
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in ("%load_ext ddplab", SPIN, AFTER, OK)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "magic.ipynb")
    return "magic.ipynb"


def _prompts_js(n: int) -> str:
    """A page function true when code cell ``n``'s prompt shows it ran (a number, not [*])."""
    return (f"() => {{ const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')][{n}];"
            f" return p !== undefined && /\\[\\d+\\]/.test(p.textContent); }}")


def _wait_for_ranks(marker: str, n: int) -> list:
    """The job's processes once ``n`` of them run the cell's script (its ranks), or what there is
    when PAGE_MS has passed (the assertion after the page then says so)."""
    import time
    from conftest import job_processes
    end = time.monotonic() + PAGE_MS / 1000
    while True:
        found = job_processes(marker)
        ranks = [p for p in found if any(a.endswith("spin.py") for a in (p.info["cmdline"] or []))]
        if len(ranks) >= n or time.monotonic() > end:
            return ranks
        time.sleep(0.2)


def test_ddplab_cell_runs_is_interrupted_and_the_kernel_goes_on(jupyterlab, session_runs_dir):
    base, token, folder = jupyterlab
    name = _magic_notebook(folder)
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _open_and_run_all(page, f"{base}/lab/tree/{name}?token={token}")

            # the spinning job runs: its live status line names both ranks
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-OutputArea pre, .jp-OutputArea code')]
                        .some(e => / s \\| (rank 0: .*rank 1: |ranks 0-1: )/.test(e.textContent))""",
                timeout=PAGE_MS)
            running = _wait_for_ranks(str(session_runs_dir), 2)
            page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Interrupt Kernel").first.click()
            # the interrupted cell ends with KeyboardInterrupt; Run All stops there
            page.wait_for_function(_prompts_js(1), timeout=PAGE_MS)
            page.locator(".jp-OutputArea-output", has_text="KeyboardInterrupt").first.wait_for(timeout=PAGE_MS)
            from conftest import assert_nothing_left
            assert_nothing_left(str(session_runs_dir))

            # the same kernel runs the rest: the result of the interrupted run, then a job to its verdict
            page.locator(".jp-CodeCell").nth(2).click()
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run Selected Cell and All Below").first.click()
            page.wait_for_function(_prompts_js(3), timeout=CELLS_MS)
            after = page.locator(".jp-CodeCell").nth(2).locator(".jp-OutputArea").inner_text()
            done = page.locator(".jp-CodeCell").nth(3).locator(".jp-OutputArea")
            done.locator("b", has_text="OK").first.wait_for(timeout=PAGE_MS)
            done.scroll_into_view_if_needed()
            MAGIC_SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(MAGIC_SHOT), full_page=False)
            done_text = done.inner_text()
        except Exception:
            _failed_shot(page, MAGIC_SHOT)
            raise
        finally:
            browser.close()

    assert len(running) == 2, "the spinning job's two ranks were running when the kernel was interrupted"
    assert "after the interrupt: interrupted" in after, after
    assert "sum 2" in done_text or "OK" in done_text, done_text
    assert MAGIC_SHOT.stat().st_size > 10_000
    from conftest import assert_nothing_left
    assert_nothing_left(str(session_runs_dir))


TIMELINE_SHOT = ROOT / "build" / "browser-01-timeline.png"


def test_stored_notebook_01_shows_the_hang_as_a_picture(jupyterlab):
    """What an instructor opening the stored execution of notebook 01 (course-src/executed/; the learner's
    copy in notebooks/ has no output, issue 42) sees without running anything: the cell under "The hang as a
    picture" has the timeline figure as its output (build/browser-01-timeline.png)."""
    base, token, folder = jupyterlab
    stored = ROOT / "course-src" / "executed" / "01_hang.ipynb"
    shutil.copy(stored, folder / stored.name)
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{base}/lab/tree/{stored.name}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=PAGE_MS)
            cell = page.locator(".jp-CodeCell", has_text="plots.timeline(broken)").first
            image = cell.locator(".jp-OutputArea img").first
            image.wait_for(state="attached", timeout=PAGE_MS)
            image.scroll_into_view_if_needed()
            box = image.bounding_box()
            TIMELINE_SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(TIMELINE_SHOT), full_page=False)
        except Exception:
            _failed_shot(page, TIMELINE_SHOT)
            raise
        finally:
            browser.close()
    assert box is not None and box["width"] > 300 and box["height"] > 100, box
    assert TIMELINE_SHOT.stat().st_size > 10_000


HUB_SHOT = ROOT / "build" / "browser-hub-fixit01.png"


def _hub_needs():
    from ddplab.tools import hub
    return hub.needs()


@pytest.mark.skipif(bool(_hub_needs()), reason=f"the classroom hub {'; '.join(map(str, _hub_needs()))}")
@pytest.mark.timeout(1800)        # a hub, a server and a real job on a loaded machine: each wait below says why
def test_a_learner_logs_in_through_the_hub_and_sees_fixit_01_graded(tmp_path):
    """One learner of the classroom's JupyterHub (classroom/jupyterhub_config.py, started as make classroom
    starts it): the hub's login page with their account and password, lab 01's notebook in their JupyterLab
    with the fix-it they typed and saved, its cells run from %load_ext on, the grade shown
    (build/browser-hub-fixit01.png); the graded run is theirs, in their own runs folder, and ended ok."""
    import json as _json

    import hubclient
    from ddplab.course import fixit
    from ddplab.tools import hub as hubtool
    state, name = tmp_path / "hub", "ddpb1"
    proc = hubclient.start_hub(1, "ddpb", state, tmp_path / "launcher.log")
    try:
        hub = hubtool.Hub.load(state)
        me = hub.learners[0]
        assert me.name == name
        # what the learner typed and saved: the reference fix under the cell's magic line; JupyterLab settings
        # as test_browser's other tests set them (every cell rendered, no news pop-up)
        nb_path = Path(me.home) / hubtool.NOTEBOOKS_DIR / "01_hang.ipynb"
        nb = _json.loads(nb_path.read_text())
        fix = next(c for c in nb["cells"] if c.get("id") == "cdea99e0")
        magic = "".join(fix["source"]).split("\n", 1)[0]
        fix["source"] = magic + "\n" + fixit.get("01").reference
        nb_path.write_text(_json.dumps(nb))
        settings = Path(me.home) / ".jupyter" / "lab" / "user-settings" / "@jupyterlab"
        (settings / "notebook-extension").mkdir(parents=True, exist_ok=True)
        (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        (settings / "apputils-extension").mkdir(parents=True, exist_ok=True)
        (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            '{"fetchNews": "false", "checkForUpdates": false}')
        for p in [Path(me.home) / ".jupyter", *(Path(me.home) / ".jupyter").rglob("*"), nb_path]:
            os.chown(p, me.uid, os.stat(me.home).st_gid)
        learner = hubclient.Learner(hub.url, me.name, me.uid, me.home)
        learner.log_in(hub.api_token)
        learner.start_server()
        code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
        load_at = next(i for i, c in enumerate(code_cells) if c.get("id") == "b4641e92")
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                page.goto(f"{hub.url}/hub/login")
                page.fill("#username_input", me.name)
                page.fill("#password_input", me.password)
                page.click("#login_submit")
                page.wait_for_url("**/user/**", timeout=PAGE_MS)
                page.goto(f"{hub.url}/user/{me.name}/lab/tree/01_hang.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=PAGE_MS)
                page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=PAGE_MS)
                page.locator(".jp-CodeCell").nth(load_at).click()
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run Selected Cell and All Below").first.click()
                # the fix-it cell runs (its prompt shows [*]), then the grade cell has its number
                page.wait_for_function(
                    f"""() => {{ const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')][{load_at + 1}];
                               return p !== undefined && /\\[(\\*|\\d+)\\]/.test(p.textContent); }}""", timeout=PAGE_MS)
                page.wait_for_function(_prompts_js(load_at + 2), timeout=2 * CELLS_MS)
                graded = page.locator(".jp-CodeCell").nth(load_at + 2).locator(".jp-OutputArea")
                graded.locator(".jp-OutputArea-output").first.wait_for(timeout=PAGE_MS)
                page.locator(".jp-CodeCell").nth(load_at + 1).scroll_into_view_if_needed()
                graded.scroll_into_view_if_needed()
                HUB_SHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(HUB_SHOT), full_page=False)
                # only the fix-it and its grade count: "Run Selected Cell and All Below" also runs the cells
                # after them (the key points read the lab's runs, which this learner did not make)
                errors = sum(page.locator(".jp-CodeCell").nth(load_at + k).locator(
                    ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback").count()
                    for k in (1, 2))
            except Exception:
                _failed_shot(page, HUB_SHOT)
                raise
            finally:
                browser.close()
    finally:
        code = hubclient.stop_hub(proc)
        left = hubclient.processes_of(me.uid) if "me" in locals() else []
        runs = sorted((Path(me.home) / hubtool.RUNS_DIR).rglob("result.json")) if "me" in locals() else []
        results = [_json.loads(r.read_text()) for r in runs]
        hubclient.remove_accounts([name])
    assert errors == 0
    # the graded attempt is this learner's run, in their own runs folder, and it ended ok
    fixes = [r for r in results if r.get("target") == "fix01"]
    assert fixes and fixes[-1]["status"] == "ok", [(r.get("target"), r.get("status")) for r in results]
    assert code == 0 and not left, left
    assert HUB_SHOT.stat().st_size > 10_000
