"""The README stays true: every setting and every serve option is documented there."""

from __future__ import annotations

from queen_pg.cli import _env_name
from queen_pg.settings import Settings
from tests.conftest import ROOT


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    for field in Settings.model_fields:
        env = _env_name(field).split(" or ")[0]
        assert f"`{env}`" in readme, f"{env} is missing from the README's configuration table"
    assert "make run" in readme and "make test" in readme
