"""A pytest plugin that starts the slowest test cases first, for ``tools/gpu_check.py``'s test runs.

``$KVLAB_SLOW_FIRST`` names cases (a JSON list of pytest node ids, slowest first; gpu_check takes them from the
last record's ``slowest_tests``). Each one found runs first, followed by one other case, then every other case in
collection order. Under pytest-xdist's ``--dist load --maxschedchunk 1`` each worker is sent two cases, then one at
a time as it frees up, so every slow case starts at once on a worker of its own; in collection order the compiling
tests of one file queue behind each other while other workers idle. Without the variable nothing changes.

    python3 -m pytest -p slow_first -n 14 --dist load --maxschedchunk 1 tests/   # tools/ on PYTHONPATH
"""

from __future__ import annotations

import json
import os

ENV = "KVLAB_SLOW_FIRST"


def run_order(ids: list[str], slow: list[str]) -> list[int]:
    """Indices into ``ids`` in run order: each of ``slow`` that ``ids`` holds, in ``slow``'s order, followed by the
    first case not yet placed; then the rest in their order."""
    where = {nodeid: k for k, nodeid in enumerate(ids)}
    first = [where[nodeid] for nodeid in dict.fromkeys(slow) if nodeid in where]
    chosen = set(first)
    rest = [k for k in range(len(ids)) if k not in chosen]
    order = []
    for k in first:
        order.append(k)
        if rest:
            order.append(rest.pop(0))
    return order + rest


def pytest_collection_modifyitems(session, config, items) -> None:
    slow = json.loads(os.environ.get(ENV) or "[]")
    if slow:
        items[:] = [items[k] for k in run_order([item.nodeid for item in items], slow)]
