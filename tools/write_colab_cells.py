"""Write (or check) the Colab cells of the lessons and the README's Colab badge.

The repository URL stands in one place, ``[project.urls] Repository`` in pyproject.toml; this tool
copies it into

- cell 0 of every notebook: a markdown "Open in Colab" badge (tagged ``colab-badge``);
- the first code cell of every notebook (tagged ``colab-setup``, six lines): on Colab only, it
  clones the repository and runs the clone's ``kvlab/lab/colab_setup.py``, which installs the course
  from its pyproject (the pinned transformers) while keeping Colab's own torch, ipywidgets and
  jupyter packages, and prints the runtime, GPU and dtype the lesson will use; elsewhere it does
  nothing;
- the README's badge line (it opens lesson 00).

Re-running it changes nothing. A fork changes the one line in pyproject.toml and runs it again
(MAINTAINING.md, "A fork: the repository URL"; the README says so in one line).

    python tools/write_colab_cells.py          # every notebook in notebooks/, and the README
    python tools/write_colab_cells.py notebooks/03_hf_caches.ipynb notebooks/04_graph_replay_failures.ipynb
    python tools/write_colab_cells.py --check  # exit 1 if a file differs from what it would write
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
BADGE_TAG, SETUP_TAG = "colab-badge", "colab-setup"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
README_BADGE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)$", re.MULTILINE)
# Notebook metadata Colab reads: open the notebook on a GPU runtime (a T4) unless the user picks
# another one.
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}

# The set-up cell: it clones the course, then the clone's kvlab/lab/colab_setup.py does the rest (it
# runs before kvlab is installed, so it cannot be imported as kvlab.lab.colab_setup); {repository}
# is filled in.
SETUP_CELL = """\
import os, runpy, subprocess, sys  # noqa: E401, I001
if "google.colab" in sys.modules:  # Colab only (elsewhere nothing): clone the course; kvlab/lab/colab_setup.py installs it
    home, source = os.environ.get("KVLAB_COLAB_HOME", "/content/kvlab"), os.environ.get("KVLAB_COLAB_SOURCE", "{repository}")
    if not os.path.isdir(home) and (git := subprocess.run(["git", "clone", "--quiet", "--depth", "1", source, home], capture_output=True, text=True)).returncode:
        raise RuntimeError(f"could not clone {{source}} ({{git.stderr.strip()}}): check the network, or set KVLAB_COLAB_SOURCE")
    runpy.run_path(f"{{home}}/kvlab/lab/colab_setup.py", {{"HOME": home, "SOURCE": source}}, run_name="__main__")"""


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``[project.urls] Repository`` of pyproject.toml, without a trailing slash or ``.git``."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        found = re.search(r'^\s*Repository\s*=\s*"([^"]+)"', text, re.MULTILINE)
        url = found.group(1) if found else None
    else:
        url = tomllib.loads(text).get("project", {}).get("urls", {}).get("Repository")
    if not url:
        raise SystemExit(
            f'{pyproject}: no [project.urls] Repository = "https://github.com/OWNER/REPO"'
        )
    return url.rstrip("/").removesuffix(".git")


def colab_url(repository: str, notebook: str) -> str:
    """The Colab address that opens ``notebooks/<notebook>`` of the repository's main branch."""
    github = repository.removeprefix("https://github.com/")
    if github == repository:
        raise SystemExit(
            f"the Repository URL must be a https://github.com/OWNER/REPO address, got {repository}"
        )
    return f"https://colab.research.google.com/github/{github}/blob/main/notebooks/{notebook}"


def badge(repository: str, notebook: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repository, notebook)})"


def setup_source(repository: str) -> str:
    return SETUP_CELL.format(repository=repository)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _tags(cell: dict) -> list:
    return cell.get("metadata", {}).get("tags", [])


def refreshed(notebook: dict, name: str, repository: str) -> dict:
    """The notebook with its badge cell at 0 and its set-up cell as the first code cell (after the
    title cell)."""
    cells = [c for c in notebook["cells"] if not {BADGE_TAG, SETUP_TAG} & set(_tags(c))]
    badge_cell = {
        "cell_type": "markdown",
        "id": BADGE_TAG,
        "metadata": {"tags": [BADGE_TAG]},
        "source": _lines(badge(repository, name)),
    }
    setup_cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": SETUP_TAG,
        "metadata": {"tags": [SETUP_TAG]},
        "outputs": [],
        "source": _lines(setup_source(repository)),
    }
    title = (
        1 if cells and cells[0]["cell_type"] == "markdown" else 0
    )  # the lesson's title and what it teaches
    notebook = dict(notebook, cells=[badge_cell, *cells[:title], setup_cell, *cells[title:]])
    notebook["metadata"] = {**notebook.get("metadata", {}), **COLAB_METADATA}
    return notebook


def render_notebook(path: Path, repository: str) -> str:
    """What this tool writes into ``path`` (the same layout as the stored notebooks: one-space
    indent, UTF-8)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return (
        json.dumps(refreshed(notebook, path.name, repository), indent=1, ensure_ascii=False) + "\n"
    )


def render_readme(path: Path, repository: str) -> str:
    """The README with its badge line (the one starting ``[![Open In Colab]``) pointing at lesson
    00."""
    text = path.read_text(encoding="utf-8")
    if not README_BADGE.search(text):
        raise SystemExit(f"{path}: no '[![Open In Colab](...)](...)' line to refresh")
    return README_BADGE.sub(lambda _: badge(repository, "00_setup.ipynb"), text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks to refresh (default: every notebooks/*.ipynb)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file differs from what it would write",
    )
    args = p.parse_args(argv)
    repository = repository_url()
    targets = [
        (nb, render_notebook) for nb in (args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb")))
    ]
    targets.append((README, render_readme))
    stale = []
    for path, render in targets:
        new = render(path, repository)
        if new != path.read_text(encoding="utf-8"):
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in stale:
        said = "differs from what tools/write_colab_cells.py writes" if args.check else "refreshed"
        print(f"{said}: {path}")
    if args.check and stale:
        print(
            "refresh with: python tools/write_colab_cells.py"
            + "".join(f" {nb}" for nb in args.notebooks)
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
