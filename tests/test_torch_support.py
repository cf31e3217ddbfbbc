"""On a torch version ddplab was not measured with, the engine says in one line per missing internal
what it could not read, instead of failing; on a measured one it says nothing."""
import sys
import types

from ddplab.engine import torch_support


def test_a_measured_version_adds_no_note(monkeypatch):
    monkeypatch.setattr(torch_support, "version", lambda: "2.13.0+cpu")
    assert torch_support.notes() == ()


def test_an_unknown_version_names_each_internal_it_could_not_find(monkeypatch):
    monkeypatch.setattr(torch_support, "version", lambda: "9.9.0")
    fake = types.ModuleType("torch._C._distributed_c10d")
    fake._WorkerServer = object          # present; the flight recorder's dump is not
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", fake)
    notes = torch_support.notes()
    assert len(notes) == 1 and "_dump_fr_trace_json" in notes[0] and "9.9.0" in notes[0]


def test_an_unknown_version_with_every_internal_adds_no_note(monkeypatch):
    monkeypatch.setattr(torch_support, "version", lambda: "9.9.0")
    assert torch_support.notes() == ()      # this torch has both
