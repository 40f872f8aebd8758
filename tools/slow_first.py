"""A pytest plugin that starts the slowest test cases first, for ``tools/gpu_check.py``'s test runs.

``$KVLAB_SLOW_FIRST`` names cases (a JSON list of pytest node ids, slowest first; gpu_check takes
them from the last record's ``slowest_tests``). Each one found runs first, in that order, then every
other case in the order the other plugins left. Under pytest-xdist's ``--dist loadgroup`` each
worker is sent one unit (a case, or the cases of one ``xdist_group``) and another as it runs low, so
every slow case starts early on a worker of its own; in collection order the compiling tests of one
file queue behind each other while other workers idle. Without the variable nothing changes.

The reordering is a hook wrapper: it runs after every plugin's and conftest's own
``pytest_collection_modifyitems`` (``tests/conftest.py`` sorts with ``trylast``, which a plain hook
of a ``-p`` plugin would precede).

    python3 -m pytest -p slow_first -n 14 --dist loadgroup tests/   # tools/ on PYTHONPATH
"""

from __future__ import annotations

import json
import os

import pytest

ENV = "KVLAB_SLOW_FIRST"


def run_order(ids: list[str], slow: list[str]) -> list[int]:
    """Indices into ``ids`` in run order: each of ``slow`` that ``ids`` holds, in ``slow``'s order,
    then the rest in their order."""
    where = {nodeid: k for k, nodeid in enumerate(ids)}
    first = [where[nodeid] for nodeid in dict.fromkeys(slow) if nodeid in where]
    chosen = set(first)
    return first + [k for k in range(len(ids)) if k not in chosen]


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    yield  # every other implementation, conftest's trylast sort included, has run
    slow = json.loads(os.environ.get(ENV) or "[]")
    if slow:
        items[:] = [items[k] for k in run_order([item.nodeid for item in items], slow)]
