"""The action adapters (translation of every action, coordinate scaling,
execution) and the environments, against the fake controld and guestd. The
effects of each action on a real screen are tested in test_realstack.py."""

from __future__ import annotations

import numpy as np
import pytest

import forkfleet
from forkfleet import aci
from forkfleet.adapters import AnthropicComputer, OpenAIComputer, Scaler, model_size
from forkfleet.aci.v1 import aci_pb2 as a
from forkfleet.env import DesktopEnv, VectorDesktopEnv, to_actions
from conftest import run_async


def kinds(plan):
    return [x.WhichOneof("action") for x in plan.actions]


class FakeSession:
    """Just a screen for translate()."""

    def __init__(self, w=1280, h=800):
        self.welcome = a.HelloResponse(screen=a.ScreenSizeResponse(width=w, height=h))


def test_scaling():
    assert model_size(1280, 800) == (1280, 800)
    w, h = model_size(1920, 1080)
    assert w * h <= 1_150_000 and abs(w / h - 16 / 9) < 0.01
    sc = Scaler(1280, 800, 1024, 640)
    assert sc.to_screen(512, 320) == (640, 400)
    assert sc.to_screen(5000, -3) == (1279, 0)  # clamped onto the screen
    assert sc.to_model(640, 400) == (512, 320)
    assert sc.observe().max_long_edge == 1024
    assert Scaler(1280, 800, 1280, 800).observe().max_long_edge == 0


def test_anthropic_translation():
    c = AnthropicComputer(FakeSession(), display_width=1024, display_height=640)
    assert c.tool_definition() == {"type": "computer_20250124", "name": "computer",
                                   "display_width_px": 1024, "display_height_px": 640}
    p = c.translate({"action": "left_click", "coordinate": [512, 320]})
    assert kinds(p) == ["click"] and (p.actions[0].click.at.x, p.actions[0].click.at.y) == (640, 400)
    assert p.observe.max_long_edge == 1024
    p = c.translate({"action": "left_click", "coordinate": [0, 0], "text": "shift+ctrl"})
    assert kinds(p) == ["key_down", "key_down", "click", "key_up", "key_up"]
    assert [p.actions[4].key_up.key, p.actions[3].key_up.key] == ["shift", "ctrl"]
    for name, button, count in [("right_click", a.MOUSE_BUTTON_RIGHT, 1), ("middle_click", a.MOUSE_BUTTON_MIDDLE, 1),
                                ("double_click", a.MOUSE_BUTTON_LEFT, 2), ("triple_click", a.MOUSE_BUTTON_LEFT, 3)]:
        ck = c.translate({"action": name, "coordinate": [1, 1]}).actions[0].click
        assert (ck.button, ck.count) == (button, count)
    assert not c.translate({"action": "left_click"}).actions[0].click.HasField("at")
    p = c.translate({"action": "key", "text": "ctrl+a Delete cmd+Return"})
    assert [x.WhichOneof("action") for x in p.actions] == ["key_combo", "key_press", "key_combo"]
    assert list(p.actions[0].key_combo.keys) == ["ctrl", "a"] and list(p.actions[2].key_combo.keys) == ["super", "Return"]
    assert c.translate({"action": "type", "text": "héllo"}).actions[0].type_text.text == "héllo"
    assert kinds(c.translate({"action": "mouse_move", "coordinate": [10, 10]})) == ["move"]
    d = c.translate({"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [1023, 639]})
    moves = [x.move.to for x in d.actions if x.WhichOneof("action") == "move"]
    assert kinds(d)[:2] == ["move", "button_down"] and kinds(d)[-1] == "button_up"
    assert (moves[0].x, moves[0].y, moves[-1].x, moves[-1].y) == (0, 0, 1279, 799)
    assert kinds(c.translate({"action": "left_mouse_down", "coordinate": [5, 5]})) == ["move", "button_down"]
    assert kinds(c.translate({"action": "left_mouse_up"})) == ["button_up"]
    sc = c.translate({"action": "scroll", "coordinate": [10, 10], "scroll_direction": "up", "scroll_amount": 5})
    assert (sc.actions[0].scroll.dx, sc.actions[0].scroll.dy) == (0, -5)
    sc = c.translate({"action": "scroll", "scroll_direction": "right", "scroll_amount": 2, "text": "shift"})
    assert kinds(sc) == ["key_down", "scroll", "key_up"] and sc.actions[1].scroll.dx == 2
    hk = c.translate({"action": "hold_key", "text": "shift", "duration": 0.5})
    assert kinds(hk) == ["key_down", "wait", "key_up"] and hk.actions[1].wait.milliseconds == 500
    assert c.translate({"action": "wait", "duration": 2}).actions[0].wait.milliseconds == 2000
    assert c.translate({"action": "screenshot"}).actions == []
    assert c.translate({"action": "cursor_position"}).cursor
    z = c.translate({"action": "zoom", "region": [0, 0, 512, 320]})
    assert (z.observe.region.width, z.observe.region.height) == (640, 400)
    for bad in ({"action": "fly"}, {"action": "left_click", "coordinate": [1]}, {"action": "type"},
                {"action": "scroll", "scroll_direction": "sideways"}, {"action": "wait", "duration": 999},
                {"action": "zoom", "region": [5, 5, 1, 1]}, {"action": "key", "text": ""}):
        with pytest.raises(forkfleet.InvalidArgument):
            c.translate(bad)
    no_shot = AnthropicComputer(FakeSession(), screenshot_after_action=False)
    assert no_shot.translate({"action": "type", "text": "x"}).observe is None


def test_openai_translation():
    c = OpenAIComputer(FakeSession(), display_width=640, display_height=400)
    assert c.tool_definition()["display_width"] == 640
    ck = c.translate({"type": "click", "button": "right", "x": 320, "y": 200}).actions[0].click
    assert (ck.at.x, ck.at.y, ck.button) == (640, 400, a.MOUSE_BUTTON_RIGHT)
    assert c.translate({"type": "click", "button": "wheel", "x": 1, "y": 1}).actions[0].click.button == a.MOUSE_BUTTON_MIDDLE
    assert c.translate({"type": "double_click", "x": 1, "y": 1}).actions[0].click.count == 2
    s = c.translate({"type": "scroll", "x": 10, "y": 10, "scroll_x": 0, "scroll_y": -150}).actions[0].scroll
    assert (s.dx, s.dy) == (0, -3)  # 150 model px = 300 screen px = 3 notches of 100 px
    s = c.translate({"type": "scroll", "x": 10, "y": 10, "scroll_x": 5, "scroll_y": 0}).actions[0].scroll
    assert (s.dx, s.dy) == (1, 0)  # any distance is at least a notch
    assert c.translate({"type": "type", "text": "abc"}).actions[0].type_text.text == "abc"
    kp = c.translate({"type": "keypress", "keys": ["CTRL", "SHIFT", "T"]}).actions[0].key_combo
    assert list(kp.keys) == ["ctrl", "shift", "t"]
    assert c.translate({"type": "keypress", "keys": ["ENTER"]}).actions[0].key_press.key == "Return"
    assert c.translate({"type": "keypress", "keys": ["ArrowLeft"]}).actions[0].key_press.key == "Left"
    dr = c.translate({"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 50, "y": 50}, {"x": 100, "y": 0}]})
    moves = [(x.move.to.x, x.move.to.y) for x in dr.actions if x.WhichOneof("action") == "move"]
    assert kinds(dr)[:2] == ["move", "button_down"] and kinds(dr)[-1] == "button_up"
    assert (100, 100) in moves and moves[-1] == (200, 0)  # through every point of the path
    assert kinds(c.translate({"type": "move", "x": 1, "y": 2})) == ["move"]
    assert c.translate({"type": "wait"}).actions[0].wait.milliseconds == 1000
    assert c.translate({"type": "screenshot"}).observe is not None
    for bad in ({"type": "click", "button": "sideways", "x": 1, "y": 1}, {"type": "drag", "path": [{"x": 1, "y": 1}]},
                {"type": "keypress", "keys": []}, {"type": "teleport"}, {"type": "move", "x": "a", "y": 1}):
        with pytest.raises(forkfleet.InvalidArgument):
            c.translate(bad)


@run_async
async def test_adapters_execute(fake):
    s = await aci.dial(fake.aci_url, fake.aci_token)
    try:
        comp = AnthropicComputer(s, display_width=640, display_height=400)
        r = await comp.execute({"action": "mouse_move", "coordinate": [320, 200]})
        assert r.image is not None and r.media_type == "image/png"
        assert await s.cursor_position() == (640, 400)
        r = await comp.execute({"action": "cursor_position"})
        assert r.output == "X=320,Y=200"
        blocks = (await comp.execute({"action": "screenshot"})).to_anthropic()
        assert blocks[0]["type"] == "image" and blocks[0]["source"]["media_type"] == "image/png"
        oa = OpenAIComputer(s)
        out = (await oa.execute({"type": "click", "button": "left", "x": 5, "y": 6})).to_openai()
        assert out["type"] == "computer_screenshot" and out["image_url"].startswith("data:image/png;base64,")
        assert await s.cursor_position() == (5, 6)
    finally:
        await s.close()


def test_env_actions():
    assert to_actions(None) == []
    assert [x.WhichOneof("action") for x in to_actions(
        [{"type": "click", "x": 1, "y": 2}, {"type": "key", "keys": "Return"}, aci.move(1, 1), {"type": "noop"}])] == \
        ["click", "key_press", "move"]
    with pytest.raises(forkfleet.InvalidArgument):
        to_actions({"type": "click", "x": 1})
    with pytest.raises(forkfleet.InvalidArgument):
        to_actions({"type": "jump"})


def test_desktop_env(fake):
    with forkfleet.Client(fake.target) as c:
        rewards = []

        def reward(session, shot, info):
            rewards.append(info["steps"])
            return 1.0, info["steps"] >= 2

        env = DesktopEnv(c, create={"screen": (1280, 800)}, reward_fn=reward, max_steps=5)
        obs, info = env.reset(seed=1)
        assert obs.shape == (800, 1280, 3) and info["sandbox_id"].startswith("sb-")
        assert env.observation_space["shape"] == (800, 1280, 3) and env.action_space["type"] == "dict"
        first = env.sandbox_id
        obs, r, term, trunc, info = env.step({"type": "click", "x": 10, "y": 10})
        assert (r, term, trunc) == (1.0, False, False) and obs.shape == (800, 1280, 3)
        obs, r, term, trunc, info = env.step([aci.type_text("x"), aci.key("Return")])
        assert term and rewards == [1, 2]
        env.reset()
        assert env.sandbox_id != first
        with pytest.raises(forkfleet.NotFound):
            c.get_sandbox(first)
        env.close()


def test_vector_env_forks_and_claims(fake):
    with forkfleet.Client(fake.target) as c:
        golden = c.create_sandbox(wait_ready=True).checkpoint()
        env = VectorDesktopEnv(c, 3, checkpoint=golden.id)
        obs, infos = env.reset()
        assert obs.shape == (3, 800, 1280, 3) and len(set(env.sandbox_ids)) == 3
        assert all(c.get_sandbox(i).info.checkpoint_id == golden.id for i in env.sandbox_ids)
        # Replicas showing the same screen cost one full frame per round.
        assert sum(i["from_cache"] for i in infos) == 2
        obs, rew, term, trunc, infos = env.step([{"type": "noop"}] * 3)
        assert rew.shape == (3,) and not term.any() and obs.shape == (3, 800, 1280, 3)
        assert env.frame_cache.stats().hits >= 4
        with pytest.raises(forkfleet.InvalidArgument):
            env.step([{"type": "noop"}])
        env.close()
        pool = c.create_pool("env-pool-" + golden.id, 2, checkpoint=golden.id)
        env = VectorDesktopEnv(c, 2, pool=pool.id)
        obs, infos = env.reset()
        assert obs.shape[0] == 2 and all(c.get_sandbox(i).info.pool_id == pool.id for i in env.sandbox_ids)
        env.close()
        c.delete_pool(pool.id)
        with pytest.raises(forkfleet.InvalidArgument):
            VectorDesktopEnv(c, 2, pool="p", checkpoint="c")
