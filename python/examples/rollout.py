"""A rollout loop over 8 forked replicas.

Reach a state once (a golden sandbox with a command typed into its terminal),
checkpoint it while it runs, fork it into 8 verified live replicas, and run a
policy on all of them concurrently: each step is the policy's actions and the
observation after them in one round trip, and one FrameCache makes replicas
that show the same screen cost one full frame per round.

    python examples/rollout.py [--target unix:///run/forkfleet/controld.sock] [--steps 20]

The policy here is random clicks and keys; put a model behind ``policy``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import numpy as np

import forkfleet
from forkfleet import aci

REPLICAS = 8


def policy(obs: np.ndarray, rng: random.Random) -> list:
    """Observation (h, w, 3) -> ACI actions. Random, for the example."""
    h, w, _ = obs.shape
    if rng.random() < 0.5:
        return [aci.click(rng.randrange(w), rng.randrange(h))]
    return [aci.type_text(rng.choice(["ls", "pwd", "date"])), aci.key("Return")]


async def rollout(i: int, replica: forkfleet.AsyncSandbox, cache: aci.FrameCache, steps: int) -> dict:
    rng = random.Random(i)
    async with await replica.aci(frame_cache=cache) as s:
        obs = (await s.screenshot(aci.jpeg(80))).array()
        hits = 0
        for _ in range(steps):
            r = await s.step(policy(obs, rng), observe=aci.jpeg(80))
            obs = r.observation.array()
            hits += r.observation.from_cache
        return {"replica": replica.id, "generation": s.generation, "cache_hits": hits}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", default=None, help="controld (default: the local unix socket)")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()

    async with forkfleet.AsyncClient(args.target, timeout=120) as c:
        golden = await c.create_sandbox(wait_ready=True, labels={"example": "rollout"})
        try:
            async with await golden.aci() as s:  # reach the state to branch from
                await s.step([aci.type_text("echo ready to branch"), aci.key("Return")])
            ck = await golden.checkpoint()  # live: the golden sandbox keeps running
            t0 = time.perf_counter()
            results = await ck.fork(REPLICAS, ttl=600)
            replicas = forkfleet.sandboxes(results)
            print(f"forked {len(replicas)} verified replicas in {time.perf_counter() - t0:.2f}s")
            if err := forkfleet.first_error(results):
                print(f"{REPLICAS - len(replicas)} replicas failed, the first: {err!r}")
            try:
                cache = aci.FrameCache()
                t0 = time.perf_counter()
                stats = await asyncio.gather(*(rollout(i, r, cache, args.steps) for i, r in enumerate(replicas)))
                dt = time.perf_counter() - t0
                for st in stats:
                    print(st)
                print(f"{len(replicas) * args.steps} steps in {dt:.2f}s; frame cache {cache.stats()}")
            finally:
                await asyncio.gather(*(r.delete() for r in replicas), return_exceptions=True)
                await ck.delete()
        finally:
            await golden.delete()


if __name__ == "__main__":
    asyncio.run(main())
