"""The docs' pictures: the approval card, the Edit & approve modal and the Home tab, as the
running service sends them to Slack, drawn by tests/pictures.py. `PICTURES_DIR=docs/images`
writes them for the docs site (`python -m pytest tests/bot/test_pictures.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests import pictures
from tests.bot.conftest import SlackClient
from tests.bot.test_e2e import ask
from tests.bot.test_edits import open_edit
from tests.bot.test_home import open_home
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import FakeSlack

ARGS = {"amount": 500, "toAccount": "ACC-12345"}


def keep(name: str, blocks: list[dict[str, Any]], *, title: str) -> None:
    image = pictures.render(blocks, title=title)
    assert image.width == pictures.WIDTH and image.height > 200
    if where := os.environ.get("PICTURES_DIR"):
        image.save(Path(where) / f"{name}.png", optimize=True)


async def test_the_card_the_modal_and_the_home_as_pictures(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=ARGS)
    card = asked.card.args["blocks"]
    assert any(b["type"] == "actions" for b in card)
    keep("card", card, title="#approvers")
    opened = await open_edit(client, fake_slack, team, asked.card)
    modal = opened.args["view"]
    keep("edit-modal", modal["blocks"], title=modal["title"]["text"])
    home = await open_home(client, team, "UBOSS")
    keep("home", home["blocks"], title="Greenlight · Home")
