"""Sampler arguments: NaN and infinity are refused (NaN < 0 is false, so a NaN temperature passed the old check and
sampled from NaN probabilities: gibberish"""

from __future__ import annotations

import math

import pytest

from igi_sdk.engine.sampler import Sampler


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": -1.0},
        {"repeat_penalty": math.nan},
        {"repeat_penalty": math.inf},
        {"top_p": math.nan},
    ],
)
def test_non_finite_and_negative_values_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Sampler(**kw)  # type: ignore[arg-type]


def test_ordinary_values_are_accepted() -> None:
    assert Sampler(temperature=0.0, repeat_penalty=1.1).temperature == 0.0
