"""The top frames of a py-spy profile (`bench/forwarding.py --profile FILE`, raw collapsed
stacks): by own samples (the frame was running) and by total samples (the frame was on the
stack), each as a share of all samples recorded (py-spy records busy samples only).

    .venv/bin/python bench/profile_top.py FILE [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<where>[^:()]*)(?::\d+)?\)$")


def _name(frame: str) -> str:
    # One name per function, whatever line of it was sampled: "Class.method (path)".
    match = _FRAME.match(frame)
    if match is None:
        return frame
    where = re.sub(r"^.*?/(site-packages|lib/python3\.\d+)/", "", match["where"])
    return f"{match['function']} ({where})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in args.profile.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        count = int(match["count"])
        frames = [_name(f) for f in match["stack"].split(";")]
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    print(f"{samples} samples")
    for title, counter in (("own", own), ("total", total)):
        print(f"\ntop {args.top} by {title} samples")
        for frame, count in counter.most_common(args.top):
            print(f"  {100 * count / samples:5.1f} %  {frame}")


if __name__ == "__main__":
    main()
