"""The scripted scene: NPC personas, the player's lines, and the timed events of one phase.

Everything is derived from ``seed`` and the phase duration, so both phases (governor on / off) play the
same scene.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Persona:
    """One NPC: name, system prompt, and the player's lines to it (cycled)."""

    name: str
    system_prompt: str
    lines: tuple[str, ...]


PERSONAS: tuple[Persona, ...] = (
    Persona(
        "Bram",
        "You are Bram, a gruff village blacksmith. Answer in one or two short sentences.",
        (
            "Can you fix my sword?",
            "What is the best metal for armor?",
            "Have you seen any bandits?",
            "How much for a new shield?",
        ),
    ),
    Persona(
        "Mira",
        "You are Mira, a cheerful innkeeper. Answer in one or two short sentences.",
        (
            "Do you have a room for tonight?",
            "What is on the menu?",
            "Any news from the capital?",
            "Who is the stranger in the corner?",
        ),
    ),
    Persona(
        "Tomas",
        "You are Tomas, a tired city guard. Answer in one or two short sentences.",
        (
            "Is the north gate open?",
            "What happened at the market?",
            "Can I carry my bow in town?",
            "Where is the captain?",
        ),
    ),
    Persona(
        "Zara",
        "You are Zara, a clever travelling merchant. Answer in one or two short sentences.",
        (
            "What are you selling today?",
            "Do you buy old maps?",
            "Where did you get that silk?",
            "Can you give me a discount?",
        ),
    ),
)


@dataclass(frozen=True)
class SceneTimes:
    """When things happen in one phase, seconds from the phase start.

    Attributes:
        talk_start_s: the first NPC starts talking (frames before it are the quiet baseline).
        talk_end_s: no new player line after this. [talk_start_s, talk_end_s) is the scripted talk window,
            the frame set the phases are compared on (the same in every phase).
        spike_s: level-load spike: the game reclaims VRAM and renders a heavier frame.
        spike_end_s: the spike's extra render work ends.
        restore_s: the game restores the VRAM budget it reclaimed.
        duration_s: the phase ends.
    """

    talk_start_s: float
    talk_end_s: float
    spike_s: float
    spike_end_s: float
    restore_s: float
    duration_s: float

    @classmethod
    def for_duration(cls, duration_s: float) -> SceneTimes:
        """The standard scene scaled to a phase of ``duration_s`` seconds."""
        d = duration_s
        return cls(
            talk_start_s=0.1 * d,
            talk_end_s=0.9 * d,
            spike_s=0.45 * d,
            spike_end_s=0.45 * d + min(3.0, 0.06 * d),
            restore_s=0.6 * d,
            duration_s=d,
        )

    @property
    def look_s(self) -> float:
        """Mid-scene, before the level load: the first NPC is shown the frame the game renders (with a projector)."""
        return 0.3 * self.duration_s

    @property
    def quiet_window_s(self) -> tuple[float, float]:
        """Before any NPC talks: the quiet baseline (the machine's own frame jitter, daemon idle)."""
        return (0.0, self.talk_start_s)

    @property
    def talk_window_s(self) -> tuple[float, float]:
        """The scripted talk window [talk_start_s, talk_end_s)."""
        return (self.talk_start_s, self.talk_end_s)


@dataclass(frozen=True)
class NpcPlan:
    """One NPC's part in the scene: start offset, line order and pauses between lines."""

    persona: Persona
    start_s: float
    lines: tuple[str, ...]
    pauses_s: tuple[float, ...]


def plan_scene(n_npcs: int, times: SceneTimes, seed: int) -> list[NpcPlan]:
    """Deterministic NPC plans for ``n_npcs`` (1..4) NPCs."""
    if not 1 <= n_npcs <= len(PERSONAS):
        raise ValueError(f"--npcs must be 1..{len(PERSONAS)}, got {n_npcs}")
    rng = random.Random(seed)
    plans = []
    for i, persona in enumerate(PERSONAS[:n_npcs]):
        lines = list(persona.lines)
        rng.shuffle(lines)
        pauses = tuple(round(rng.uniform(0.5, 2.0), 2) for _ in range(64))
        plans.append(
            NpcPlan(persona=persona, start_s=times.talk_start_s + i * 0.5, lines=tuple(lines), pauses_s=pauses)
        )
    return plans
