"""Gymnasium-style environments over forkfleet sandboxes.

``DesktopEnv`` is one sandbox: ``reset()`` gets a fresh one (a claim from a
pool, a fork of a checkpoint, or a cold boot), ``step(action)`` runs the
action and observes in one ACI round trip. ``VectorDesktopEnv`` is N replicas
of one golden checkpoint: ``reset()`` claims N from a pool or forks the
checkpoint N times in one request, ``step(actions)`` steps them concurrently,
and one FrameCache makes replicas showing the same screen cost one full frame.

Observation and action spaces are plain dicts (``observation_space``,
``action_space``); when gymnasium is importable, ``gym_observation_space``
and ``gym_action_space`` are its Box/Dict spaces, and the classes subclass
``gymnasium.Env`` so wrappers accept them. Rewards come from ``reward_fn``
(the task's, e.g. checking a file through the session); 0 without one.

Actions are ACI Action messages (a list runs as one step), or dicts::

    {"type": "click", "x": 10, "y": 20, "button": "left", "count": 1}
    {"type": "move", "x": .., "y": ..}   {"type": "drag", "x1":.., "y1":.., "x2":.., "y2":..}
    {"type": "scroll", "x": .., "y": .., "dx": 0, "dy": 3}
    {"type": "type", "text": "hello"}    {"type": "key", "keys": ["ctrl", "s"]}
    {"type": "wait", "seconds": 0.5}     {"type": "noop"}
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from forkfleet import _sync, client as client_mod, errors
from forkfleet.aci import FrameCache, actions as act
from forkfleet.aci.session import Screenshot, Session
from forkfleet.aci.v1 import aci_pb2 as a

try:  # gymnasium is optional: used only when importable
    import gymnasium as _gym
    from gymnasium import spaces as _spaces
    _EnvBase: type = _gym.Env
except ImportError:  # pragma: no cover - depends on the machine
    _gym = None
    _spaces = None
    _EnvBase = object

ACTION_TYPES = ("noop", "move", "click", "drag", "scroll", "type", "key", "wait")
_BUTTONS = {"left": act.LEFT, "middle": act.MIDDLE, "right": act.RIGHT, "back": act.BACK, "forward": act.FORWARD}

RewardFn = Callable[[Session, Screenshot, dict], Any]


def to_actions(action: Any) -> list[a.Action]:
    """An env action (an Action, a list of them, or a dict) as ACI actions."""
    if action is None:
        return []
    if isinstance(action, a.Action):
        return [action]
    if isinstance(action, (list, tuple)):
        out: list[a.Action] = []
        for x in action:
            out += to_actions(x)
        return out
    if not isinstance(action, Mapping):
        raise errors.InvalidArgument(f"env: action {action!r}: want a dict or aci Action(s)")
    kind = action.get("type")
    try:
        if kind == "noop":
            return []
        if kind == "move":
            return [act.move(action["x"], action["y"])]
        if kind == "click":
            button = action.get("button", "left")
            if button not in _BUTTONS:
                raise errors.InvalidArgument(f"env: button {button!r}", field="button")
            return [act.click_button(action["x"], action["y"], _BUTTONS[button], int(action.get("count", 1)))]
        if kind == "drag":
            return [act.drag(action["x1"], action["y1"], action["x2"], action["y2"], int(action.get("steps", 10)))]
        if kind == "scroll":
            return [act.scroll(action["x"], action["y"], int(action.get("dx", 0)), int(action.get("dy", 0)))]
        if kind == "type":
            return [act.type_text(str(action["text"]))]
        if kind == "key":
            keys = action["keys"]
            return [act.key(*([keys] if isinstance(keys, str) else keys))]
        if kind == "wait":
            return [act.wait(float(action.get("seconds", 0.1)))]
    except KeyError as e:
        raise errors.InvalidArgument(f"env: {kind} action needs {e.args[0]!r}", field=str(e.args[0])) from None
    raise errors.InvalidArgument(f"env: unknown action type {kind!r} (want one of {', '.join(ACTION_TYPES)})",
                                 field="type")


def _spaces_for(width: int, height: int, channels: int) -> tuple[dict, dict]:
    obs = {"type": "box", "shape": (height, width, channels), "dtype": "uint8", "low": 0, "high": 255}
    act_space = {"type": "dict", "spaces": {
        "type": {"type": "discrete", "values": list(ACTION_TYPES)},
        "x": {"type": "box", "low": 0, "high": width - 1, "dtype": "int32"},
        "y": {"type": "box", "low": 0, "high": height - 1, "dtype": "int32"},
        "button": {"type": "discrete", "values": list(_BUTTONS)},
        "text": {"type": "text"}, "keys": {"type": "sequence", "of": "text"},
        "dx": {"type": "box", "low": -1000, "high": 1000, "dtype": "int32"},
        "dy": {"type": "box", "low": -1000, "high": 1000, "dtype": "int32"},
        "seconds": {"type": "box", "low": 0.0, "high": 60.0, "dtype": "float32"},
    }}
    return obs, act_space


class _Source:
    """Where a fresh sandbox comes from: a pool, a checkpoint, or an image."""

    def __init__(self, c: client_mod.AsyncClient, pool: str | None, checkpoint: str | None,
                 create: Mapping[str, Any], labels: Mapping[str, str] | None, ttl: float | None):
        if pool and checkpoint:
            raise errors.InvalidArgument("env: give pool or checkpoint, not both")
        self.c, self.pool, self.checkpoint = c, pool, checkpoint
        self.create, self.labels, self.ttl = dict(create), dict(labels or {}), ttl

    async def take(self, n: int) -> list[client_mod.AsyncSandbox]:
        if self.pool:
            claims = await asyncio.gather(*(self.c.claim(self.pool, labels=self.labels, ttl=self.ttl) for _ in range(n)))
            return [cl.sandbox for cl in claims]
        if self.checkpoint:
            results = await self.c.checkpoint(self.checkpoint).fork(n, labels=self.labels, ttl=self.ttl)
            got = client_mod.sandboxes(results)
            if len(got) < n:
                await asyncio.gather(*(sb.delete() for sb in got), return_exceptions=True)
                raise client_mod.first_error(results) or errors.Internal("env: fork returned too few replicas")
            return got
        return list(await asyncio.gather(*(self.c.create_sandbox(
            wait_ready=True, labels=self.labels, ttl=self.ttl, **self.create) for _ in range(n))))


class _Slot:
    """One sandbox of an env and its session."""

    def __init__(self) -> None:
        self.sandbox: client_mod.AsyncSandbox | None = None
        self.session: Session | None = None
        self.steps = 0

    async def release(self, delete: bool) -> None:
        s, sb = self.session, self.sandbox
        self.session = self.sandbox = None
        if s is not None:
            await s.close()
        if sb is not None and delete:
            try:
                await sb.delete()
            except errors.NotFound:
                pass


class VectorDesktopEnv(_EnvBase):
    """N sandboxes stepped together (observations stacked: (n, h, w, 3)).

    Args:
        client: a Client or AsyncClient (None: the default controld).
        n: number of sandboxes.
        checkpoint: reset forks this golden checkpoint n times.
        pool: reset claims n sandboxes from this pool (of the checkpoint).
        create: CreateSandbox keywords when neither is given (cold boots).
        observe: the ScreenshotRequest of every step (PNG by default; JPEG
            is cheaper to send and to decode).
        reward_fn: async or sync fn(session, screenshot, info) -> reward, or
            (reward, terminated).
        max_steps: truncation after this many steps per episode.
        frame_cache: shared by the sessions (a new one by default).
        delete: delete the sandboxes on reset and close (default True).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, client: Any = None, n: int = 1, *, checkpoint: str | None = None, pool: str | None = None,
                 create: Mapping[str, Any] | None = None, observe: a.ScreenshotRequest | None = None,
                 reward_fn: RewardFn | None = None, max_steps: int | None = None,
                 frame_cache: FrameCache | None = None, labels: Mapping[str, str] | None = None,
                 ttl: float | None = None, delete: bool = True, step_timeout: float | None = 60.0):
        if n < 1:
            raise errors.InvalidArgument(f"env: n must be at least 1 (got {n})", field="n")
        if client is None:
            client = client_mod.Client()
        self._client = client.aio if isinstance(client, _sync.SyncProxy) else client
        self.num_envs = n
        self._source = _Source(self._client, pool, getattr(checkpoint, "id", checkpoint), create or {}, labels, ttl)
        self._observe = observe if observe is not None else act.png()
        self._reward_fn = reward_fn
        self._max_steps = max_steps
        self.frame_cache = frame_cache if frame_cache is not None else FrameCache()
        self._delete = delete
        self._timeout = step_timeout
        self._slots = [_Slot() for _ in range(n)]
        self.observation_space: dict = {}
        self.action_space: dict = {}
        self._last: list[np.ndarray | None] = [None] * n

    # ---- sync API (runs the async core on the SDK's loop)

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        """New sandboxes for every slot; returns (observations, infos)."""
        return _sync.run(self.areset(seed=seed, options=options))

    def step(self, actions: Sequence[Any]):
        """Steps every slot with its action; returns (observations, rewards,
        terminated, truncated, infos) as arrays and a list of dicts."""
        return _sync.run(self.astep(actions))

    def close(self) -> None:
        _sync.run(self.aclose())

    def render(self) -> np.ndarray | None:
        return np.stack(self._last) if all(x is not None for x in self._last) else None

    @property
    def sessions(self) -> list[Session]:
        return [s.session for s in self._slots]

    @property
    def sandbox_ids(self) -> list[str]:
        return [s.sandbox.id if s.sandbox is not None else "" for s in self._slots]

    # ---- async core

    async def areset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        await asyncio.gather(*(s.release(self._delete) for s in self._slots))
        sandboxes = await self._source.take(self.num_envs)
        sessions = await asyncio.gather(*(sb.aci(frame_cache=self.frame_cache, reconnect=True) for sb in sandboxes),
                                        return_exceptions=True)
        for slot, sb, s in zip(self._slots, sandboxes, sessions):
            slot.sandbox, slot.steps = sb, 0
            slot.session = s if isinstance(s, Session) else None
        failed = [s for s in sessions if not isinstance(s, Session)]
        if failed:
            raise failed[0]
        # The first replica's frame goes into the FrameCache before the
        # others ask: replicas of one checkpoint show the same screen, so the
        # rest cost a not_modified each instead of a full frame.
        first = await self._slots[0].session.screenshot(self._observe, timeout=self._timeout)
        shots = [first, *await asyncio.gather(*(s.session.screenshot(self._observe, timeout=self._timeout)
                                                for s in self._slots[1:]))]
        obs = [sh.array() for sh in shots]
        self._set_spaces(obs[0])
        self._last = obs
        infos = [self._info(slot, sh) for slot, sh in zip(self._slots, shots)]
        return np.stack(obs), infos

    async def astep(self, actions: Sequence[Any]):
        if len(actions) != self.num_envs:
            raise errors.InvalidArgument(f"env: {len(actions)} actions for {self.num_envs} sandboxes", field="actions")
        results = await asyncio.gather(*(self._step_one(slot, x) for slot, x in zip(self._slots, actions)))
        obs, rew, term, trunc, infos = zip(*results)
        self._last = list(obs)
        return np.stack(obs), np.array(rew, np.float32), np.array(term), np.array(trunc), list(infos)

    async def _step_one(self, slot: _Slot, action: Any):
        if slot.session is None:
            raise errors.FailedPrecondition("env: reset() first")
        r = await slot.session.step(to_actions(action), self._observe, timeout=self._timeout)
        shot = r.observation
        if shot is None:
            raise r.observation_error or errors.Internal("env: step returned no observation")
        slot.steps += 1
        info = self._info(slot, shot)
        info["action_errors"] = [str(e) for _, e in r.errors()]
        reward, terminated = 0.0, False
        if self._reward_fn is not None:
            out = self._reward_fn(slot.session, shot, info)
            if asyncio.iscoroutine(out):
                out = await out
            reward, terminated = (out if isinstance(out, tuple) else (out, False))
        truncated = self._max_steps is not None and slot.steps >= self._max_steps
        return shot.array(), float(reward), bool(terminated), bool(truncated), info

    def _info(self, slot: _Slot, shot: Screenshot) -> dict:
        s = slot.session
        return {"sandbox_id": slot.sandbox.id, "generation": s.generation, "frame_hash": bytes(shot.frame_hash),
                "from_cache": shot.from_cache, "steps": slot.steps}

    def _set_spaces(self, obs: np.ndarray) -> None:
        h, w, c = obs.shape
        self.observation_space, self.action_space = _spaces_for(w, h, c)

    @property
    def gym_observation_space(self):
        """The observation space as a gymnasium Box (None without gymnasium or before reset)."""
        if _spaces is None or not self.observation_space:
            return None
        return _spaces.Box(0, 255, shape=self.observation_space["shape"], dtype=np.uint8)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.release(self._delete) for s in self._slots), return_exceptions=True)


class DesktopEnv(VectorDesktopEnv):
    """One sandbox with the gymnasium single-env API: ``reset()`` returns
    (observation, info) and ``step(action)`` (observation, reward,
    terminated, truncated, info)."""

    def __init__(self, client: Any = None, **kw: Any):
        super().__init__(client, 1, **kw)

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        obs, infos = super().reset(seed=seed, options=options)
        return obs[0], infos[0]

    def step(self, action: Any):
        obs, rew, term, trunc, infos = super().step([action])
        return obs[0], float(rew[0]), bool(term[0]), bool(trunc[0]), infos[0]

    def render(self) -> np.ndarray | None:
        return self._last[0]

    @property
    def session(self) -> Session | None:
        return self._slots[0].session

    @property
    def sandbox_id(self) -> str:
        return self.sandbox_ids[0]
