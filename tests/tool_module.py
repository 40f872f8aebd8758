"""The scripts of tools/ as modules, for the tests of those scripts (tools/ is not a package)."""

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str):
    """``tools/<name>.py`` imported as the module ``name`` (registered in ``sys.modules``, where
    dataclasses look their module up), freshly executed at each call."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
