"""The accessibility tree helpers: render_tree matches the Go client's
RenderTree line for line, and check_tree refuses hostile ids."""

from __future__ import annotations

import pytest

import forkfleet
from forkfleet import aci
from forkfleet.aci.v1 import aci_pb2 as a


def sample() -> a.A11yTreeResponse:
    n = a.A11yNode
    return a.A11yTreeResponse(apps=[a.A11yApp(name="Chromium", node=1)], nodes=[
        n(id=0, role="desktop frame", name="main", children=[1]),
        n(id=1, role="application", name="Chromium", app=1, children=[2]),
        n(id=2, role="frame", name="Page", app=1, window=2, children=[3, 4, 5, 6], bounds=a.Rect(width=1280, height=800)),
        n(id=3, role="panel", app=1, window=2),
        n(id=4, role="push button", name="Save", app=1, window=2, actions=["press"],
          states=1 << 12 | 1 << 8 | 1 << 24 | 1 << 25, bounds=a.Rect(x=10, y=20, width=100, height=30)),
        n(id=5, role="entry", name="Name", app=1, window=2, text="Ada", states=1 << 8, actions=["activate"]),
        n(id=6, role="slider", app=1, window=2, value=0.5),
    ])


def test_render_tree_as_go():
    # The Go client's TestRenderTree expects the same text.
    assert aci.render_tree(sample()) == (
        '[0] desktop frame "main"\n'
        '  [1] application "Chromium"\n'
        '    [2] frame "Page" @0,0 1280x800\n'
        '      [4] push button "Save" @10,20 100x30 focused\n'
        '      [5] entry "Name" text="Ada"\n'
        '      [6] slider value=0.5\n')
    assert "[3] panel" in aci.render_tree(sample(), all=True)
    assert aci.states(sample().nodes[4]) == ["enabled", "focused", "sensitive", "showing"]


@pytest.mark.parametrize("mutate", [
    lambda r: setattr(r.nodes[3], "id", 9),
    lambda r: r.nodes[2].children.append(1),
    lambda r: r.nodes[2].children.append(99),
    lambda r: setattr(r.nodes[3], "app", 7),
])
def test_check_tree_refuses_hostile_ids(mutate):
    aci.check_tree(sample())
    r = sample()
    mutate(r)
    with pytest.raises(forkfleet.ProtocolError):
        aci.check_tree(r)


def test_action_builders():
    assert aci.do_action(":1.2:/x", "press").kind == a.A11Y_ACTION_KIND_DO
    assert aci.set_text(":1.2:/x", "t").text == "t"
    assert aci.focus(":1.2:/x").kind == a.A11Y_ACTION_KIND_FOCUS
