"""The accessibility tree (``a11y_tree``, ``a11y_action``; docs/aci-spec.md):
request builders, the AT-SPI state names of ``A11yNode.states``, the checks
a client makes of a tree a guestd sent, and the compact text rendering for
prompts (the Go client's ``aci.RenderTree``, line for line).

    tree = await s.a11y_tree()
    print(aci.render_tree(tree))        # [4] push button "Save" @540,310 120x32 focused
    await s.a11y_action(aci.do_action(tree.nodes[4].ref, "press"))
"""

from __future__ import annotations

from forkfleet import errors
from forkfleet.aci.v1 import aci_pb2 as a

# AT-SPI state names, by bit of A11yNode.states (AtspiStateType).
STATE_NAMES = (
    "invalid", "active", "armed", "busy", "checked", "collapsed", "defunct", "editable", "enabled",
    "expandable", "expanded", "focusable", "focused", "has tooltip", "horizontal", "iconified", "modal",
    "multi line", "multiselectable", "opaque", "pressed", "resizable", "selectable", "selected",
    "sensitive", "showing", "single line", "stale", "transient", "vertical", "visible",
    "manages descendants", "indeterminate", "required", "truncated", "animated", "invalid entry",
    "supports autocompletion", "selectable text", "is default", "visited", "checkable", "has popup",
    "read only",
)
STATE_ACTIVE, STATE_CHECKED, STATE_EDITABLE, STATE_ENABLED = 1, 4, 7, 8
STATE_FOCUSABLE, STATE_FOCUSED, STATE_SELECTED, STATE_SENSITIVE, STATE_SHOWING, STATE_VISIBLE = 11, 12, 23, 24, 25, 30


def has_state(node: a.A11yNode, bit: int) -> bool:
    return bool(node.states & (1 << bit))


def states(node: a.A11yNode) -> list[str]:
    """The names of node's states."""
    return [STATE_NAMES[i] if i < len(STATE_NAMES) else f"state {i}" for i in range(64) if has_state(node, i)]


def do_action(ref: str, name: str) -> a.A11yActionRequest:
    """Does the element's action named name (one of its ``actions``)."""
    return a.A11yActionRequest(ref=ref, kind=a.A11Y_ACTION_KIND_DO, action=name)


def focus(ref: str) -> a.A11yActionRequest:
    return a.A11yActionRequest(ref=ref, kind=a.A11Y_ACTION_KIND_FOCUS)


def set_text(ref: str, text: str) -> a.A11yActionRequest:
    return a.A11yActionRequest(ref=ref, kind=a.A11Y_ACTION_KIND_SET_TEXT, text=text)


def set_value(ref: str, value: float) -> a.A11yActionRequest:
    return a.A11yActionRequest(ref=ref, kind=a.A11Y_ACTION_KIND_SET_VALUE, value=value)


def scroll_into_view(ref: str) -> a.A11yActionRequest:
    return a.A11yActionRequest(ref=ref, kind=a.A11Y_ACTION_KIND_SCROLL_INTO_VIEW)


def check_tree(r: a.A11yTreeResponse) -> a.A11yTreeResponse:
    """Refuses a tree whose ids do not index its nodes (a hostile or broken
    guestd): every id is its position, every child comes after its parent
    and inside the reply, so walking it never loops or reads out of range."""
    n, apps = len(r.nodes), len(r.apps)
    for i, node in enumerate(r.nodes):
        if node.id != i:
            raise errors.ProtocolError(f"aci: a11y_tree: node {i} has id {node.id}")
        for c in node.children:
            if c <= i or c >= n:
                raise errors.ProtocolError(f"aci: a11y_tree: node {i} has child {c} of {n} nodes")
        if node.app > apps:
            raise errors.ProtocolError(f"aci: a11y_tree: node {i} names app {node.app} of {apps}")
    return r


_CONTEXT_ROLES = {"desktop frame", "application", "frame", "window", "dialog"}


def _keep(node: a.A11yNode) -> bool:
    return (node.role in _CONTEXT_ROLES or bool(node.name) or bool(node.actions) or bool(node.text)
            or node.HasField("value"))


def _cut(s: str, n: int) -> str:
    b = s.encode()
    if len(b) <= n:
        return s
    return b[:n].decode(errors="ignore") + "…"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def render_tree(r: a.A11yTreeResponse, *, all: bool = False, max_line_bytes: int = 120) -> str:
    """One element a line, indented by depth: ``[id] role "name" @x,y wxh``
    plus focused/checked/selected/disabled, value and text. Unnamed elements
    without actions, text or value are left out unless ``all``."""
    nodes = r.nodes
    if not nodes:
        return ""
    out: list[str] = []
    stack = [(0, 0)]
    while stack:
        i, depth = stack.pop()
        node = nodes[i]
        if all or _keep(node):
            line = "  " * min(depth, 40) + f"[{node.id}] {node.role}"
            if node.name:
                line += " " + _quote(_cut(node.name, max_line_bytes))
            if node.HasField("bounds"):
                b = node.bounds
                line += f" @{b.x},{b.y} {b.width}x{b.height}"
            for bit, word in ((STATE_FOCUSED, "focused"), (STATE_CHECKED, "checked"), (STATE_SELECTED, "selected")):
                if has_state(node, bit):
                    line += " " + word
            if node.states and not has_state(node, STATE_ENABLED) and not has_state(node, STATE_SENSITIVE) and node.actions:
                line += " disabled"
            if node.HasField("value"):
                v = repr(node.value)
                line += " value=" + (v[:-2] if v.endswith(".0") else v)
            if node.text:
                line += " text=" + _quote(_cut(node.text, max_line_bytes))
            out.append(line)
            depth += 1
        stack.extend((c, depth) for c in reversed(node.children) if c > i)
    return "\n".join(out) + "\n"
