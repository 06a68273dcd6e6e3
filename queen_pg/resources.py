"""Where the broker's non-Python files are: ``sql/``, ``migrations/`` and ``webapp/``.

They live at the repository root (the readable source: ``sql/schema.sql``, ``sql/procedures/``).
The wheel carries them inside the package as ``queen_pg/sql``, ``queen_pg/migrations`` and
``queen_pg/webapp`` (``[tool.setuptools.package-dir]`` in ``pyproject.toml`` maps each root directory
to that package path at build time; nothing is copied in the checkout). An installed wheel finds its
packaged copy; a checkout (``pip install -e``, tests, ``make run``) finds the root directories.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent


def data_dir(name: str, marker: str) -> Path:
    """The directory ``name`` that contains ``marker``: the packaged copy first, then the checkout's."""
    for candidate in (PACKAGE / name, CHECKOUT / name):
        if (candidate / marker).is_file():
            return candidate
    raise FileNotFoundError(
        f"{name}/{marker} is neither in the package ({PACKAGE / name}) nor in a source checkout "
        f"({CHECKOUT / name}): a wheel built without it? (pyproject.toml [tool.setuptools.package-dir])"
    )
