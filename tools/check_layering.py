#!/usr/bin/env python3
"""Fails when a project #include runs against the layering.

Each source folder is a room (one CMake library); a room may include its
own headers and those of the rooms below it, never one above or beside:

  cli -> server -> engine -> engine/runner -> {scheduler, kvtier, kvevents,
                                               grammar, models/cpu,
                                               models/cuda, models/sim}
  grammar -> models/tokenizer
  models/cpu, models/cuda -> models/loader -> models/tokenizer -> models
  models/sim -> models
  scheduler -> kvcache;  kvtier -> kvcache;  kvevents -> common
  models -> kvcache -> common

`server` also reaches the generated protocol headers (`kvserve/v1/...`),
but never a device's kernels (models/cpu, models/cuda): the engine's
Platform (engine/runner/platform.h) speaks for the devices. Of the engine,
only its device wing (engine/runner) includes a device's code (models/cpu,
models/cuda, models/sim), and the headers the engine and the server include
do not bring one in either (checked through every header they reach).
Tests in tests/<area>/ may include what their area may, their own folder's
headers and tests/support/; tools/ may include every product room. The CMake
libraries link the same way (tests link only their area's library), so a
violation usually fails the build too; this check names the line.

Usage: tools/check_layering.py [--root DIR]   (exit 1 on a violation)
"""
import argparse
import pathlib
import re
import subprocess
import sys

# Each room and the rooms it may include (itself implied), transitively
# closed below.
DIRECT = {
    "common": [],
    "kvcache": ["common"],
    "models": ["kvcache"],
    "models/tokenizer": ["models"],
    "models/loader": ["models/tokenizer"],
    "models/cpu": ["models/loader"],
    "models/cuda": ["models/loader"],
    "models/sim": ["models"],
    "scheduler": ["kvcache"],
    "kvtier": ["kvcache"],
    "kvevents": ["common"],
    "grammar": ["models/tokenizer"],
    "engine/runner": ["scheduler", "kvtier", "kvevents", "grammar", "models/cpu",
                      "models/cuda", "models/sim"],
    "engine": ["engine/runner"],
    "proto": [],
    "server": ["engine", "proto"],
    "cli": ["server"],
}
# Rooms a room may not include although they lie below it.
FORBIDDEN = {
    "server": {"models/cpu", "models/cuda", "models/sim"},
    "engine": {"models/cpu", "models/cuda", "models/sim"},
}
# Test areas: the rooms whose libraries the area's tests link.
TEST_AREAS = {
    "common": ["common"],
    "kvcache": ["kvcache"],
    "kvtier": ["kvtier"],
    "kvevents": ["kvevents"],
    "grammar": ["grammar", "models/loader"],
    "models": ["models/cpu", "models/cuda", "models/sim"],
    "scheduler": ["scheduler"],
    "engine": ["engine"],
    "server": ["server"],
    "cli": ["cli"],
    "fuzz": ["server"],
    "support": ["models/cpu", "models/cuda"],
}
SOURCE_SUFFIXES = {".cc", ".h", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def closure(room):
    seen, todo = set(), [room]
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            todo.extend(DIRECT[r])
    return seen


def room_of_include(path):
    """The room a quoted include names, or None for a non-project header."""
    parts = path.split("/")
    if parts[0] == "kvserve":  # generated from proto/kvserve/v1/*.proto
        return "proto"
    if parts[0] == "models" and len(parts) > 2 and parts[1] in (
            "tokenizer", "loader", "cpu", "cuda", "sim"):
        return "models/" + parts[1]
    if parts[0] == "engine" and len(parts) > 2 and parts[1] == "runner":
        return "engine/runner"
    if parts[0] in DIRECT:
        return parts[0]
    if parts[0] in ("tests", "tools"):
        return "/".join(parts[:2])
    return None


def allowed_for(file_path):
    """(room or label, the set of include rooms a file may use)."""
    parts = file_path.split("/")
    top = parts[0]
    if top == "tools":
        rooms = closure("cli") | {"tools/bench", "tools/sanitizers"}
        return top, rooms
    if top == "tests":
        area = parts[1] if len(parts) > 2 else ""
        if area not in TEST_AREAS:
            return None, None
        rooms = {"tests/" + area, "tests/support"}
        for base in TEST_AREAS[area]:
            rooms |= closure(base)
        return "tests/" + area, rooms
    room = room_of_include(file_path)
    if room is None or room.startswith(("tests", "tools")):
        return None, None
    return room, closure(room) - FORBIDDEN.get(room, set())


def project_includes(root, rel, cache):
    """The project headers that `rel` includes directly (that exist)."""
    if rel not in cache:
        path = root / rel
        found = []
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            for line in text.splitlines():
                m = INCLUDE.match(line)
                if m and room_of_include(m.group(1)) is not None and (
                        root / m.group(1)).is_file():
                    found.append(m.group(1))
        cache[rel] = found
    return cache[rel]


def reached_through(root, rel, forbidden, cache):
    """(header reached, the include that leads to it) for each header of a
    forbidden room that `rel` reaches only through other headers."""
    out, seen = [], set()
    for first in project_includes(root, rel, cache):
        todo = [first]
        while todo:
            h = todo.pop()
            if h in seen:
                continue
            seen.add(h)
            if h != first and room_of_include(h) in forbidden:
                out.append((h, first))
                continue
            todo.extend(project_includes(root, h, cache))
    return out


def tracked_sources(root):
    out = subprocess.run(["git", "-C", str(root), "ls-files"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if pathlib.PurePosixPath(line).suffix in SOURCE_SUFFIXES:
            yield line


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).parents[1])
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    violations, checked, cache = [], 0, {}
    for rel in tracked_sources(root):
        label, rooms = allowed_for(rel)
        if rooms is None:
            continue
        checked += 1
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = room_of_include(m.group(1))
            if target is not None and target not in rooms:
                violations.append(
                    f"{rel}:{lineno}: {label} may not include "
                    f'"{m.group(1)}" (room {target})')
        if label in FORBIDDEN:
            for h, first in reached_through(root, rel, FORBIDDEN[label],
                                            cache):
                violations.append(f'{rel}: {label} reaches "{h}" (room '
                                  f'{room_of_include(h)}) through "{first}"')
    for v in violations:
        print(v)
    print(f"check_layering: {checked} files, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
