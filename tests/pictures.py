"""Draws Block Kit as Slack shows it, roughly, to PNG: the docs' pictures come from the real
blocks the service sends (tests/bot/test_pictures.py), not from drawings by hand.

It knows the blocks Greenlight sends (header, section with fields and an accessory, context,
divider, actions, input) and mrkdwn's marks (bold, italic, strike, code, mentions, dates).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

WIDTH, PAD, GAP = 760, 24, 10
FONTS = Path("/usr/share/fonts/truetype/dejavu")
INK, MUTED, LINK, RULE = (29, 28, 29), (97, 96, 97), (18, 100, 163), (221, 221, 221)
GREEN, RED = (0, 122, 90), (224, 30, 90)
Font = ImageFont.FreeTypeFont | ImageFont.ImageFont

_MENTION = re.compile(r"<[@#]([A-Z0-9]+)(?:\|([^>]*))?>")
_SPECIAL = re.compile(r"<!(?:date\^[^|>]*\|([^>]*)|subteam\^([A-Z0-9]+)(?:\|[^>]*)?|(\w+))>")
_LINK = re.compile(r"<([^|>]+)\|([^>]+)>|<(https?://[^>]+)>")


def _font(size: int, *, bold: bool = False, mono: bool = False) -> Font:
    name = "DejaVuSansMono.ttf" if mono else "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    try:
        return ImageFont.truetype(str(FONTS / name), size)
    except OSError:  # no DejaVu here: Pillow's own font, so the picture still draws
        return ImageFont.load_default(size)


def plain(text: str) -> str:
    """mrkdwn as a reader sees it: mentions, dates and links resolved, marks dropped."""
    text = _MENTION.sub(
        lambda m: ("@" if m.group(0)[1] == "@" else "#") + (m.group(2) or m.group(1)), text
    )
    text = _SPECIAL.sub(lambda m: m.group(1) or f"@{m.group(2) or m.group(3)}", text)
    text = _LINK.sub(lambda m: m.group(2) or m.group(3), text)
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)
    text = re.sub(r"(?<![\w_])_([^_\n]+)_(?![\w_])", r"\1", text)
    text = re.sub(r"(?<![\w~])~([^~\n]+)~(?![\w~])", r"\1", text)
    return html.unescape(text.replace("```", "").replace("`", ""))


class _Canvas:
    """Lines laid down the page top to bottom; the image is cut to what was drawn."""

    def __init__(self) -> None:
        self.image = Image.new("RGB", (WIDTH, 4000), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.y = PAD

    def text(self, text: str, *, x: int = PAD, size: int = 15, bold: bool = False,
             color: tuple[int, int, int] = INK, width: int | None = None) -> None:  # fmt: skip
        font = _font(size, bold=bold)
        width = width or WIDTH - x - PAD
        for paragraph in text.split("\n"):
            for line in self._wrapped(paragraph, font, width):
                self.draw.text((x, self.y), line, font=font, fill=color)
                self.y += size + 6

    def _wrapped(self, text: str, font: Font, width: int) -> list[str]:
        lines, line = [], ""
        for word in text.split(" "):
            candidate = f"{line} {word}" if line else word
            if self.draw.textlength(candidate, font=font) <= width or not line:
                line = candidate
            else:
                lines.append(line)
                line = word
        return [*lines, line]

    def button(self, x: int, label: str, style: str | None) -> int:
        """A button at (x, y); returns where the next one starts."""
        font = _font(14, bold=True)
        w = int(self.draw.textlength(label, font=font)) + 28
        fill = {"primary": GREEN, "danger": RED}.get(style or "", (255, 255, 255))
        ink = INK if fill == (255, 255, 255) else (255, 255, 255)
        self.draw.rounded_rectangle((x, self.y, x + w, self.y + 32), 6, fill=fill, outline=RULE)
        self.draw.text((x + 14, self.y + 7), label, font=font, fill=ink)
        return x + w + 8

    def done(self) -> Image.Image:
        return self.image.crop((0, 0, WIDTH, self.y + PAD))


def render(blocks: list[dict[str, Any]], *, title: str = "") -> Image.Image:
    """The blocks as one picture, under a title bar (the channel, or the modal's title)."""
    page = _Canvas()
    if title:
        page.text(title, size=17, bold=True)
        page.draw.line((0, page.y + 4, WIDTH, page.y + 4), fill=RULE, width=1)
        page.y += GAP * 2
    for block in blocks:
        _block(page, block)
        page.y += GAP
    return page.done()


def _block(page: _Canvas, block: dict[str, Any]) -> None:
    kind = block.get("type")
    if kind == "header":
        page.text(plain(block["text"]["text"]), size=19, bold=True)
    elif kind == "divider":
        page.draw.line((PAD, page.y + 4, WIDTH - PAD, page.y + 4), fill=RULE, width=1)
        page.y += GAP
    elif kind == "context":
        words = [plain(e.get("text", "")) for e in block.get("elements", []) if "text" in e]
        page.text("  ".join(words), size=13, color=MUTED)
    elif kind == "section":
        _section(page, block)
    elif kind == "actions":
        _actions(page, block.get("elements", []))
    elif kind == "input":
        page.text(plain(block["label"]["text"]), size=14, bold=True)
        element = block.get("element", {})
        value = element.get("initial_value") or (element.get("initial_option") or {}).get(
            "text", {}
        ).get("text", "")
        top = page.y
        page.y += 8
        page.text(str(value) or " ", x=PAD + 10, size=14)
        page.draw.rounded_rectangle((PAD, top, WIDTH - PAD, page.y + 4), 6, outline=MUTED)
        page.y += 8
        if hint := block.get("hint"):
            page.text(plain(hint["text"]), size=12, color=MUTED)


def _section(page: _Canvas, block: dict[str, Any]) -> None:
    accessory = block.get("accessory")
    width = WIDTH - 2 * PAD - (150 if accessory else 0)
    top = page.y
    if text := block.get("text"):
        page.text(plain(text["text"]), width=width)
    fields = block.get("fields", [])
    pairs = [fields[i : i + 2] for i in range(0, len(fields), 2)]
    for left, *rest in pairs:
        right = rest[0] if rest else None
        row = page.y
        page.text(plain(left["text"]), width=width // 2 - GAP)
        after = page.y
        if right is not None:
            page.y = row
            page.text(plain(right["text"]), x=PAD + width // 2, width=width // 2 - GAP)
        page.y = max(page.y, after)
    if accessory and accessory.get("type") == "button":
        below = page.y
        page.y = top
        page.button(WIDTH - PAD - 140, plain(accessory["text"]["text"]), accessory.get("style"))
        page.y = max(below, top + 36)


def _actions(page: _Canvas, elements: list[dict[str, Any]]) -> None:
    x = PAD
    for element in elements:
        if element.get("type") == "button":
            label = plain(element["text"]["text"])
        elif element.get("type") == "overflow":
            label = "⋯"
        else:
            label = plain((element.get("placeholder") or {}).get("text", "…"))
        if x > WIDTH - 200:
            x, page.y = PAD, page.y + 40
        x = page.button(x, label, element.get("style"))
    page.y += 36
