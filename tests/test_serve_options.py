"""Every setting is a `queen-pg serve` option as well as an environment variable, and the option wins
(the README's claim): options beyond the hand-written ones are generated from Settings."""

from __future__ import annotations

import pytest

from queen_pg.cli import _env_name, _settings, build_parser, main
from queen_pg.cli_workers import export_settings
from queen_pg.settings import Settings


def serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_every_setting_has_a_serve_option_and_names_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    out = serve_help(capsys)
    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]  # type: ignore[union-attr]
    dests = {a.dest for a in serve._actions}
    for field in Settings.model_fields:
        assert field in dests, f"setting {field} has no serve option"
        assert _env_name(field) in out, f"serve --help does not name {_env_name(field)}"
    assert "--limiter-min LIMITER_MIN" in out and "--jobs-enabled, --no-jobs-enabled" in out


def test_generated_options_set_the_setting_and_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEEN_LIMITER_MIN", "50")
    monkeypatch.setenv("QUEEN_JOBS_ENABLED", "1")
    args = build_parser().parse_args(
        ["serve", "--limiter-min", "40", "--no-jobs-enabled", "--disk-high-pct", "90.5", "--disk-path", "/var"]
    )
    s = _settings(args)
    assert (s.limiter_min, s.jobs_enabled, s.disk_high_pct, str(s.disk_path)) == (40, False, 90.5, "/var")
    untouched = _settings(build_parser().parse_args(["serve"]))
    assert (untouched.limiter_min, untouched.jobs_enabled) == (50, True)  # from the environment


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--limiter-min", "many"], "limiter_min"),
        (["--disk-high-pct", "0"], "disk_high_pct"),
        (["--limiter-min", "900", "--limiter-max", "100"], "limiter_min (900) exceeds limiter_max (100)"),
    ],
)
def test_a_bad_option_value_is_one_clear_line(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert "invalid settings" in err and said in err


def test_a_worker_reads_back_every_setting_the_parent_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    """export_settings writes each field under every variable that sets it (Settings.env_names): the
    JWT_ names, PORT and QUEEN_PORT, QUEEN_<FIELD>; Settings() in a worker then equals the parent's."""
    for name in [n for field in Settings.model_fields for n in Settings.env_names(field)]:
        monkeypatch.delenv(name, raising=False)
    parent = Settings(
        port=7001, database_url="postgresql://db/q", db_pool_size=7, jwt_role_admin="boss", tenancy_header=True
    )
    environ: dict[str, str] = {}
    export_settings(parent, environ)
    assert (environ["PORT"], environ["QUEEN_PORT"], environ["DATABASE_URL"]) == ("7001", "7001", "postgresql://db/q")
    assert (environ["JWT_ROLE_ADMIN"], environ["QUEEN_TENANCY_HEADER"]) == ("boss", "true")
    assert "QUEEN_JWT_ROLE_ADMIN" not in environ and "QUEEN_MAX_DECODED_BYTES" not in environ  # None: unset
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert Settings() == parent
