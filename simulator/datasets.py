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
