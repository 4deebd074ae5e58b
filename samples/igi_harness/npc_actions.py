"""The game's side of structured NPC replies: the reply schema, the ``give_item`` tool, and the world they act on.

Every NPC answers with a JSON object of ``SAY`` ("line, emotion, action"); the merchant may also call
``give_item``. ``NpcWorld`` is the game state the replies change: each NPC's emotion and last action, and the
player's inventory (an item given leaves the merchant's stock; the tool's result says what happened).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from igi_sdk.ipc.values import Tool, ToolCall, ToolResult

EMOTIONS = ("neutral", "happy", "angry", "afraid", "sad")
ACTIONS = ("none", "wave", "bow", "point", "walk_away")
ITEMS = ("bread", "potion", "sword", "map")
#: The reply schema of every NPC: a line to show, an emotion for the face, an action for the animation.
SAY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "line": {"type": "string", "maxLength": 40},
        "emotion": {"enum": list(EMOTIONS)},
        "action": {"enum": list(ACTIONS)},
    },
    "required": ["line", "emotion", "action"],
    "additionalProperties": False,
}
GIVE_ITEM_ARGS: dict[str, Any] = {
    "type": "object",
    "properties": {"item": {"enum": list(ITEMS)}, "count": {"type": "integer"}},
    "required": ["item", "count"],
    "additionalProperties": False,
}
GIVE_ITEM = Tool(
    name="give_item", description="Hand items from your stock to the player.", parameters=json.dumps(GIVE_ITEM_ARGS)
)


@dataclass
class NpcWorld:
    """What the NPCs' structured replies have done to the game."""

    stock: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ITEMS, 3))
    inventory: dict[str, int] = field(default_factory=dict)
    emotion: dict[str, str] = field(default_factory=dict)
    action: dict[str, str] = field(default_factory=dict)
    applied: int = 0

    def apply_reply(self, npc: str, reply: dict[str, Any]) -> str:
        """Show a ``SAY`` reply: set the NPC's emotion and action; returns the line."""
        self.emotion[npc], self.action[npc] = reply["emotion"], reply["action"]
        self.applied += 1
        return str(reply["line"])

    def give_item(self, call: ToolCall) -> ToolResult:
        """Run a ``give_item`` call against the stock; the result tells the NPC what happened."""
        args = json.loads(call.arguments)
        item, wanted = args["item"], max(0, int(args["count"]))
        given = min(wanted, self.stock.get(item, 0))
        self.stock[item] = self.stock.get(item, 0) - given
        if given:
            self.inventory[item] = self.inventory.get(item, 0) + given
        self.applied += 1
        content = json.dumps({"given": given, "item": item, "left_in_stock": self.stock[item]})
        return ToolResult(call_id=call.id, name=call.name, content=content)

    def summary(self) -> dict[str, Any]:
        """The report's view of the world after a phase."""
        return {
            "actions_applied": self.applied,
            "inventory": dict(self.inventory),
            "emotion": dict(self.emotion),
            "action": dict(self.action),
        }
