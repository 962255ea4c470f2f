"""The Python client-scale cell of benchd's clientscale suite: N ACI sessions
of the forkfleet SDK in this one process (one event loop) against benchd's
synthetic peers, closed loop (one request in flight per session).

    python clientscale.py --peers 127.0.0.1:4001,127.0.0.1:4002 --sessions 1024 \\
        --mode observe --window 5 --windows 3 --frame-bytes 90000

benchd runs it (its --clientscale-python) and reads one JSON line per
measured window on stdout: frames (or steps) completed and failed, wall and
CPU seconds of this process, RSS, and the latency samples in milliseconds.
Mode "step" runs Step(3 actions + a JPEG observation) instead of Screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

from forkfleet import aci


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def run_window(sessions, call, frame_bytes: int, seconds: float, lat: list | None):
    stop_at = time.perf_counter() + seconds
    done = [0, 0]

    async def one(s):
        pc = time.perf_counter
        local = []
        ok = failed = 0
        while True:
            t0 = pc()
            if t0 >= stop_at:
                break
            try:
                n = await call(s)
            except Exception:  # noqa: BLE001 - counted, like the Go cell
                failed += 1
                continue
            if n != frame_bytes:
                failed += 1
                continue
            ok += 1
            local.append((pc() - t0) * 1e3)
        done[0] += ok
        done[1] += failed
        if lat is not None:
            lat.extend(local)

    await asyncio.gather(*(one(s) for s in sessions))
    return done


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peers", required=True)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--mode", choices=("observe", "step"), default="observe")
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--frame-bytes", type=int, default=90000)
    a = p.parse_args()
    peers = a.peers.split(",")
    sem = asyncio.Semaphore(32)

    async def dial(i: int):
        async with sem:
            return await aci.dial(f"ws://{peers[i % len(peers)]}/aci", client_name="benchd-clientscale-python",
                                  timeout=30)

    sessions = await asyncio.gather(*(dial(i) for i in range(a.sessions)))
    if a.mode == "observe":
        req = aci.jpeg(80)

        async def call(s):
            return len((await s.screenshot(req)).data)
    else:
        actions = [aci.move(100, 100), aci.click(200, 200), aci.key("Return")]
        obs = aci.jpeg(80)

        async def call(s):
            r = await s.step(actions, obs)
            return len(r.observation.data) if r.observation is not None else -1

    await run_window(sessions, call, a.frame_bytes, 1.0, None)  # warm-up
    for _ in range(a.windows):
        lat: list[float] = []
        t0, c0 = time.perf_counter(), time.process_time()
        frames, failed = await run_window(sessions, call, a.frame_bytes, a.window, lat)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"frames": frames, "failed": failed, "wall_s": wall, "cpu_s": cpu, "rss_kb": rss_kb(),
                          "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                          "latency_ms": [round(x, 4) for x in lat]}), flush=True)
    await asyncio.gather(*(s.close() for s in sessions))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
