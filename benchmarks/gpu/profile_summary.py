"""Summarise a ``py-spy record --format raw`` profile (collapsed stacks, one per line, ending
in a sample count): each thread's share of the samples, and per thread its heaviest leaf
frames (where the samples were taken) and its heaviest frames below its common root.

    python benchmarks/gpu/profile_summary.py PROFILE.txt [--top N] [--frames K]

With ``--gil`` profiles (``side_by_side.py``'s ``profile-CONFIG-gil.txt``) a thread's share is
the share of the time it held the GIL; the frames say where.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

_THREAD = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\)(?:: (?P<name>[^;]*))?")
_POOL_INDEX = re.compile(r"_\d+$")


def parse(path: Path) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]]]:
    """Per thread (its name, pool indices folded): samples per frame on the stack (each frame
    once per stack), and samples per leaf frame."""
    threads: dict[str, Counter[str]] = defaultdict(Counter)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        name = (match and match.group("name")) or frames[0]
        name = _POOL_INDEX.sub("_N", name.strip())
        samples = int(count)
        threads[name]["<all>"] += samples
        for frame in dict.fromkeys(frames[1:]):
            threads[name][frame] += samples
        leaves[name][frames[-1] if len(frames) > 1 else "<no frame>"] += samples
    return threads, leaves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=8, help="threads shown")
    parser.add_argument("--frames", type=int, default=12, help="frames shown per thread")
    args = parser.parse_args()
    threads, leaves = parse(args.profile)
    total = sum(c["<all>"] for c in threads.values()) or 1
    ranked = sorted(threads.items(), key=lambda item: -item[1]["<all>"])
    for name, frames in ranked[: args.top]:
        own = frames["<all>"]
        print(f"{own / total:6.1%}  {own:6d}  {name}")
        print("      leaf frames:")
        for frame, count in leaves[name].most_common(args.frames):
            print(f"        {count / own:6.1%}  {frame[:140]}")
        print("      on the stack:")
        below_root = [(f, c) for f, c in frames.items() if f != "<all>" and c < 0.95 * own]
        for frame, count in sorted(below_root, key=lambda fc: -fc[1])[: args.frames]:
            print(f"        {count / own:6.1%}  {frame[:140]}")


if __name__ == "__main__":
    main()
