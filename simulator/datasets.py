"""Sequence-length distributions of public corpora, for steps whose length varies.

A training step packs one document of the corpus (cut to the model's context), padded up to a
multiple of ``pad_multiple_tokens``; lengths are drawn with a seeded generator so that runs
are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthDistribution:
    """Document lengths in tokens as a log-normal distribution with the corpus's mean.

    ``mean_tokens`` comes from the corpus's published statistics; ``sigma`` (the spread of
    log-lengths) is an estimate where the source publishes no spread.
    """

    name: str
    mean_tokens: float
    sigma: float
    source: str

    def sample(self, steps: int, max_tokens: int, seed: int = 0, pad_multiple_tokens: int = 128) -> list[int]:
        """``steps`` sequence lengths, each cut to ``max_tokens`` and padded up to a multiple.

        Raises:
            ValueError: ``steps`` < 1, or ``max_tokens`` not a positive multiple of the padding.
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if max_tokens < pad_multiple_tokens or max_tokens % pad_multiple_tokens:
            raise ValueError(f"max_tokens must be a positive multiple of {pad_multiple_tokens}, got {max_tokens}")
        # Log-normal with E[X] = mean: mu = ln(mean) - sigma^2 / 2.
        mu = math.log(self.mean_tokens) - self.sigma**2 / 2
        lengths = np.random.default_rng(seed).lognormal(mu, self.sigma, size=steps)
        padded = np.ceil(np.minimum(lengths, max_tokens) / pad_multiple_tokens) * pad_multiple_tokens
        return [int(max(pad_multiple_tokens, x)) for x in padded]


DATASETS: dict[str, LengthDistribution] = {
    "wikitext-103": LengthDistribution(
        name="wikitext-103",
        # Training split: 103,227,021 tokens in 28,475 articles = 3,625 tokens per article.
        mean_tokens=103_227_021 / 28_475,
        sigma=0.9,
        source="Merity et al., 'Pointer Sentinel Mixture Models' (ICLR 2017), Table 1: WikiText-103 "
        "train split 28,475 articles, 103,227,021 tokens. sigma = 0.9 is an estimate (the paper "
        "gives no spread of article lengths)",
    ),
}


def load_dataset(name: str) -> LengthDistribution:
    """The distribution called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}") from None


def sequence_length_warmup(
    steps: int, max_tokens: int, warmup_steps: int, *, start_tokens: int = 64, step_tokens: int = 8, first_step: int = 0
) -> list[int]:
    """Sequence lengths under sequence-length warmup, a curriculum that trains on truncated
    sequences first and lengthens them step by step.

    DeepSpeed's ``seqlen`` curriculum with its ``fixed_linear`` schedule: at step ``k`` the
    length is ``start + (max - start) * k / warmup_steps``, rounded down to a multiple of
    ``step_tokens`` (DeepSpeed's ``difficulty_step``, 8 in its examples) and ``max_tokens`` from
    ``warmup_steps`` on. Sources: Li, Zhang and He, "The Stability-Efficiency Dilemma:
    Investigating Sequence Length Warmup for Training GPT Models" (NeurIPS 2022,
    arXiv:2108.06084); DeepSpeed's curriculum-learning tutorial (deepspeed.ai/tutorials/
    curriculum-learning). ``start_tokens`` = 64 and the warmup length are the caller's choice.

    Args:
        steps: number of steps to return, starting at ``first_step`` of the schedule.

    Raises:
        TypeError: an argument that is not an integer.
        ValueError: ``steps``, ``warmup_steps`` or ``step_tokens`` < 1, ``first_step`` < 0, or ``start_tokens`` / ``max_tokens`` not
            positive multiples of ``step_tokens`` with start <= max.
    """
    for name, value in (("steps", steps), ("max_tokens", max_tokens), ("warmup_steps", warmup_steps),
                        ("start_tokens", start_tokens), ("step_tokens", step_tokens), ("first_step", first_step)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if step_tokens < 1:
        raise ValueError(f"step_tokens must be >= 1, got {step_tokens}")
    if steps < 1 or warmup_steps < 1 or first_step < 0:
        raise ValueError(f"steps and warmup_steps must be >= 1 and first_step >= 0, got steps={steps}, "
                         f"warmup_steps={warmup_steps}, first_step={first_step}")
    if start_tokens < step_tokens or start_tokens % step_tokens or max_tokens % step_tokens \
            or max_tokens < start_tokens:
        raise ValueError(f"start_tokens ({start_tokens}) and max_tokens ({max_tokens}) must be positive multiples "
                         f"of step_tokens ({step_tokens}), start <= max")
    out = []
    for k in range(first_step, first_step + steps):
        length = start_tokens + (max_tokens - start_tokens) * min(k, warmup_steps) // warmup_steps
        out.append(length // step_tokens * step_tokens)
    return out
