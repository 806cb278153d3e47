"""A process that does nothing but measure its own event loop's lag, the way the extender's
`tensile_scheduler_event_loop_lag_seconds` does (a timer every 0.1 s, how late it ran): the
baseline of what the machine alone adds to any asyncio process's wake-ups in the same run
(CPUs shared by every component of the fleet). Runs until its standard input closes, then
prints one JSON line: {"samples": n, "p50": s, "p99": s, "max": s}.

    python bench/lag_probe.py < /dev/null   # ends at once
"""

from __future__ import annotations

import asyncio
import json
import math
import sys

INTERVAL = 0.1
"""As the extender's probe (scheduler.latency.LAG_INTERVAL)."""


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def main() -> None:
    loop = asyncio.get_running_loop()
    closed = loop.run_in_executor(None, sys.stdin.read)
    lags: list[float] = []
    while not closed.done():
        asked = loop.time() + INTERVAL
        await asyncio.sleep(INTERVAL)
        lags.append(max(0.0, loop.time() - asked))
    await closed
    out = {"samples": len(lags)}
    if lags:
        out |= {"p50": quantile(lags, 0.5), "p99": quantile(lags, 0.99), "max": max(lags)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
