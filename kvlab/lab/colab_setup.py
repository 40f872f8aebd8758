"""The Colab set-up of every lesson: run by each notebook's first code cell once it has cloned the
course.

It runs before kvlab is installed, so until the install is done it uses the standard library only.
On Colab it

1. refuses a Colab torch outside the course's range (``import kvlab`` would refuse it too), saying
   what to do;
2. installs the course from the clone with pip (the pinned transformers), keeping Colab's own torch,
   ipywidgets and jupyter packages exactly as they are (one constraint each), and says so before pip
   starts; when pip fails, the end of pip's own output says why;
3. puts the clone on ``sys.path`` (a running kernel does not read an editable install's ``.pth``
   file) and changes into its ``notebooks/`` folder;
4. prints what this runtime will use (``kvlab.runtime.runtime_summary()``), or, when an older
   transformers was imported in this kernel before, asks for a restart of the session.

Run again in the same session (another notebook, the same cell twice), it installs nothing: the
course from this clone and the pinned transformers are there already. Each new Colab session
installs again, and the first lesson that loads the model downloads it again (93 MB): Colab keeps
nothing between sessions.

    runpy.run_path(f"{home}/kvlab/lab/colab_setup.py", {"HOME": home, "SOURCE": source},
                   run_name="__main__")
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time

KEEP = ("torch", "torchvision", "torchaudio", "triton", "ipywidgets", "widgetsnbextension",
        "ipykernel", "ipython",
        "notebook")  # and every jupyter* package: Colab's own, which pip must not replace


def requirement(home: str, name: str) -> str:
    """The version specifier of ``name`` in the clone's pyproject.toml dependencies
    (``">=2.6,<2.14"``)."""
    with open(os.path.join(home, "pyproject.toml"), encoding="utf-8") as f:
        found = re.search(rf'"{name}\s*([<>=!~][^"]*)"', f.read())
    if found is None:
        raise RuntimeError(f"{home}/pyproject.toml names no {name} requirement: is {home} a clone "
                           "of the course?")
    return found.group(1).replace(" ", "")


def release(version: str) -> tuple[int, int]:
    """``"2.13.0+cu128"`` -> ``(2, 13)``."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def check_torch(torch_version: str, wanted: str) -> None:
    """Refuse a torch outside ``wanted`` (``">=2.6,<2.14"``) before pip tries and fails to reconcile
    it."""
    low, high = (release(spec[2:] if spec[1] == "=" else spec[1:]) for spec in wanted.split(","))
    if not low <= release(torch_version) < high:
        raise RuntimeError(
            f"this Colab runtime has torch {torch_version}, outside the course's tested range "
            f"torch{wanted}: kvlab refuses it (its GPU lessons were measured on that range, and "
            "pip cannot install the course beside it while keeping Colab's torch). Either install "
            f"a torch in range, `!pip install 'torch{wanted}'` (a download of about 1 GB), then "
            "Runtime > Restart session and run this notebook again; or run the course on your "
            "own machine (README: Two commands).")


def installed_from(home: str) -> bool:
    """Whether the kvlab that pip has is this clone, installed (editable) by an earlier run in this
    session."""
    # the clone's own kvlab.egg-info, found first on sys.path, has none
    urls = [json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
            for dist in importlib.metadata.distributions(name="kvlab")]
    return any(os.path.realpath(url.removeprefix("file://")) == os.path.realpath(home)
               for url in urls if url)


def install(home: str, keep: dict[str, str]) -> None:
    """pip install --editable the clone, each package of ``keep`` pinned to the version Colab
    has."""
    with tempfile.NamedTemporaryFile("w", suffix="-colab-keep.txt", delete=False) as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in keep.items()))
    try:
        # a child's output would not show in the cell
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--constraint",
                               constraints.name, "--editable", home],
                              capture_output=True, text=True)
    finally:
        os.unlink(constraints.name)
    if done.returncode:
        print("\n".join((done.stdout + done.stderr).strip().splitlines()[-40:]))
        raise RuntimeError("pip could not install the course beside Colab's "
                           f"{', '.join(sorted(keep))}: pip's reasons are above")


def set_up(home: str, source: str) -> None:
    pinned = requirement(home, "transformers").removeprefix("==")
    keep = {}
    for dist in importlib.metadata.distributions():
        name = (dist.name or "").lower().replace("_", "-")
        if name.startswith("jupyter") or name in KEEP:
            keep.setdefault(name, dist.version)
    check_torch(keep.get("torch", "0"), requirement(home, "torch"))
    loaded = sys.modules.get("transformers")
    if installed_from(home) and importlib.metadata.version("transformers") == pinned:
        print(f"kvlab from {home} and transformers {pinned} are installed already in this session")
    else:
        print(f"installing the course from {source} into this Colab session: about a minute. "
              "Each new session installs it again and downloads the model again (93 MB) at its "
              "first load: Colab keeps nothing.",
              flush=True)
        started = time.perf_counter()
        install(home, keep)
        importlib.invalidate_caches()
        print(f"installed in {time.perf_counter() - started:.0f} s; torch {keep.get('torch')} "
              f"and ipywidgets {keep.get('ipywidgets', '(none)')} kept as Colab has them")
    if home not in sys.path:
        sys.path.insert(0, home)
    os.chdir(os.path.join(home, "notebooks"))
    if loaded is not None and getattr(loaded, "__version__", None) != pinned:
        print(f"transformers {getattr(loaded, '__version__', '?')} was imported in this kernel "
              f"before the course installed {pinned}: Runtime > Restart session, then run the "
              "notebook again")
        return
    from kvlab import runtime

    print(runtime.runtime_summary())


if __name__ == "__main__":
    # given by the notebook's cell: runpy.run_path(..., {"HOME": ..., "SOURCE": ...})
    set_up(HOME, SOURCE)  # noqa: F821
