"""MkDocs hook: the benchmark notes and results, which live beside the scripts that wrote them, in the site.

``benchmarks/README.md`` becomes the page ``benchmarks/design.md`` and every ``benchmarks/results/*.md`` and
``*.png`` is served at ``benchmarks/results/`` (the same path below the site as below the repository), so the
docs link to the figures the scripts committed instead of copies that could drift. A mounted file's link into
``../docs/X`` (right on GitHub) is rewritten to the site's ``../X``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
MOUNTED = {"benchmarks/design.md": REPO / "benchmarks" / "README.md"}
"""Site path -> repository file, besides the results (added by :func:`on_files`)."""
_DOCS_LINK = re.compile(r"\]\(\.\./docs/")


def on_files(files: Files, config: Any) -> Files:
    """Add the mounted files to the site's files."""
    mounted = dict(MOUNTED)
    for result in sorted((REPO / "benchmarks" / "results").iterdir()):
        if result.suffix in (".md", ".png"):
            mounted[f"benchmarks/results/{result.name}"] = result
    for src_uri, path in mounted.items():
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """On a mounted page, point links into the repository's ``docs/`` at the site's pages."""
    if page.file.src_uri in MOUNTED:
        return _DOCS_LINK.sub("](../", markdown)
    return markdown
