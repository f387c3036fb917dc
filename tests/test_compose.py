"""compose.yaml and .env.example, checked without a Docker engine: PostgreSQL 16+ with a volume
and a health check, the bot waiting for it with its settings from .env, and .env.example
listing every setting with its true default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot.settings import Settings
from tests import env_example

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, object]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_postgres_is_16_or_later_with_a_volume_and_a_health_check() -> None:
    services = compose()["services"]
    assert isinstance(services, dict)
    postgres = services["postgres"]
    image = re.fullmatch(r"postgres:(\d+)[\w.-]*", postgres["image"])
    assert image and int(image[1]) >= 16
    volume, _, target = postgres["volumes"][0].partition(":")
    assert target == "/var/lib/postgresql/data" and volume in compose()["volumes"]  # type: ignore[operator]
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]


def test_the_bot_takes_its_settings_from_env_and_waits_for_a_healthy_database() -> None:
    services = compose()["services"]
    assert isinstance(services, dict)
    bot, postgres = services["bot"], services["postgres"]
    assert bot["build"] == "." and bot["env_file"] == ".env"
    assert bot["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    url = bot["environment"]["DATABASE_URL"]
    user, db = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    assert re.fullmatch(rf"postgresql\+asyncpg://{user}:\S+@postgres:5432/{db}", url), url
    assert bot["read_only"] is True and "no-new-privileges:true" in bot["security_opt"]
    assert "3000:3000" in bot["ports"]


def listed() -> dict[str, str]:
    """.env.example's settings, commented out or not, with the values it shows."""
    found = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.fullmatch(r"(?:# )?([A-Z][A-Z0-9_]+)=(.*)", line)
        if match:
            found[match[1]] = match[2]
    return found


def test_env_example_lists_every_setting_once() -> None:
    assert (ROOT / ".env.example").read_text() == env_example.render(), (
        "rewrite it: python -m tests.env_example > .env.example"
    )
    names = re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M)
    assert sorted(names) == sorted(Settings.model_fields)


def test_the_defaults_it_shows_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncommenting every line as it stands changes nothing: each value shown parses back to
    the setting's own default."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    for name, value in listed().items():
        monkeypatch.setenv(name, value)
    assert Settings().model_dump() == Settings.model_construct().model_dump()
