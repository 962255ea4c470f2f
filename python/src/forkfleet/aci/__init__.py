"""ACI sessions: the Agent-Computer Interface of a sandbox's guestd over one
WebSocket (docs/aci-spec.md; the Go client api/aci is the reference).

    s = await aci.dial("ws://127.0.0.1:7480/v1/sandboxes/sb-1/aci", token)
    r = await s.step([aci.click(640, 400), aci.type_text("ls"), aci.key("Return")], observe=aci.png())
    r.observation.array()          # (800, 1280, 3) uint8

The generated messages are in forkfleet.aci.v1.aci_pb2.
"""

from forkfleet.aci.actions import (BACK, FORWARD, LEFT, MIDDLE, RIGHT, button_down, button_up, click, click_button,
                                   click_here, double_click, drag, hash_only, jpeg, key, key_down, key_up, middle_click,
                                   move, png, right_click, scroll, triple_click, type_text, wait)
from forkfleet.aci.a11y import (STATE_NAMES, check_tree, do_action, focus, has_state, render_tree, scroll_into_view,
                                set_text, set_value, states)
from forkfleet.aci.framecache import DEFAULT_FRAME_CACHE_BYTES, FrameCache, FrameCacheStats
from forkfleet.aci.session import (DEFAULT_CAPABILITIES, DEFAULT_READ_LIMIT, PROTOCOL_VERSION, SUBPROTOCOL, Backoff,
                                   Call, Screenshot, Session, StepResult, SyncSession, dial, dial_sync, dial_unix)
from forkfleet.aci.v1 import aci_pb2 as pb

PNG, JPEG, NONE = pb.IMAGE_FORMAT_PNG, pb.IMAGE_FORMAT_JPEG, pb.IMAGE_FORMAT_NONE

__all__ = [
    "dial", "dial_unix", "dial_sync", "Session", "SyncSession", "Call", "Screenshot", "StepResult", "Backoff",
    "FrameCache", "FrameCacheStats", "DEFAULT_FRAME_CACHE_BYTES", "DEFAULT_CAPABILITIES", "DEFAULT_READ_LIMIT",
    "PROTOCOL_VERSION", "SUBPROTOCOL", "PNG", "JPEG", "NONE", "pb",
    "move", "click", "click_button", "click_here", "double_click", "triple_click", "right_click", "middle_click",
    "button_down", "button_up", "drag", "scroll", "key", "key_down", "key_up", "type_text", "wait",
    "png", "jpeg", "hash_only", "LEFT", "MIDDLE", "RIGHT", "BACK", "FORWARD",
    "render_tree", "check_tree", "do_action", "focus", "set_text", "set_value", "scroll_into_view", "has_state",
    "states", "STATE_NAMES",
]
