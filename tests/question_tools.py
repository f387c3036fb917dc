"""Test tools that ask: an interrupt a module defines, and a tool that raises `Interrupt`
with a typed output (its answer is a form)."""

from __future__ import annotations

from typing import Literal

from genkit import Genkit, Tool
from genkit._ai._tools import Interrupt
from pydantic import BaseModel, Field


class ShippingInput(BaseModel):
    order: str = Field(description="The order to ship.")
    carrier: str = Field(description="The carrier the agent proposes.")


class PickInput(BaseModel):
    order: str


class Pick(BaseModel):
    warehouse: Literal["north", "south"] = Field(description="Where to ship from.")
    quantity: int = Field(description="How many units.", ge=1)


def register(ai: Genkit) -> list[Tool]:
    confirm = ai.define_interrupt(
        "confirmShipping",
        input_schema=ShippingInput,
        description="Ask whether an order may ship with the proposed carrier.",
    )

    @ai.tool(name="pickWarehouse", description="Choose a warehouse for an order (asks ops).")
    async def pick_warehouse(input: PickInput) -> Pick:
        raise Interrupt({"who": "approvers", "message": f"Which warehouse for {input.order}?"})

    return [confirm, pick_warehouse]
