"""An optional ipywidgets panel for a lab: pick a variant and the number of ranks, press Run.

    from ddplab.course.widgets import panel
    panel("01")

The run goes through `ddplab.run` like every other run (judged by progress, evidence read, nothing
left behind); while it runs, a status line shows each rank's state about once a second; then the
panel shows the result and keeps it as `panel.result`. Interrupting the kernel during a run ends
the job the same way Ctrl-C does.
"""
from __future__ import annotations

import ipywidgets as w
from IPython.display import display

from ddplab.origins import catalog
from ddplab.errors import DdplabError
from ddplab.front import run
from ddplab.origins.launch import max_nproc
from ddplab.views.render import status_line


class Panel(w.VBox):
    def __init__(self, lab: str | int, stall_s: float | None = None):
        self.lab = catalog.find_lab(str(lab))
        if self.lab is None:
            known = ", ".join(l.number for l in catalog.labs())
            raise DdplabError(f"unknown lab '{lab}'", hint=f"run `ddplab list` to see the labs ({known})")
        self.result = None
        names = [v.name for v in self.lab.variants]
        self.variant = w.Dropdown(options=names, value=names[0], description="variant")
        self.about = w.HTML(self._about(names[0]))
        self.nproc = w.IntSlider(value=self.lab.nproc, min=self.lab.min_nproc, max=max_nproc(),
                                 description="ranks")
        self.stall = w.FloatText(value=stall_s or self.lab.stall_s, description="stall s",
                                 tooltip="hung when no rank makes progress for this many seconds")
        self.status = w.HTML("")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.out = w.Output()
        self.variant.observe(lambda change: setattr(self.about, "value", self._about(change["new"])), "value")
        self.button.on_click(self._run)
        super().__init__([w.HTML(f"<b>Lab {self.lab.number}: {self.lab.title}</b>"), self.variant, self.about,
                          w.HBox([self.nproc, self.stall]), self.button, self.status, self.out])

    def _about(self, name: str) -> str:
        v = next(v for v in self.lab.variants if v.name == name)
        return f"<i>{v.about}</i> (expected: {v.expect}{' [' + v.signature + ']' if v.signature else ''})"

    def _progress(self, snap) -> None:
        import html
        self.status.value = f"<code>{html.escape(status_line(snap))}</code>"

    def _run(self, _button=None) -> None:
        self.button.disabled, self.button.description = True, "running..."
        self.out.clear_output()
        try:
            with self.out:
                try:
                    self.result = run(self.lab.number, variant=self.variant.value, nproc=self.nproc.value,
                                      stall_s=self.stall.value, progress=self._progress)
                    display(self.result)
                except DdplabError as e:
                    print(f"error: {e}")
        finally:
            self.button.disabled, self.button.description = False, "Run"


def panel(lab: str | int, stall_s: float | None = None) -> Panel:
    """A widget panel for one lab (variant, ranks, stall window, Run button, live status, result)."""
    return Panel(lab, stall_s)
