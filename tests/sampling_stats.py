"""Goodness of fit for the sampling tests: a G-test of observed counts against exact probabilities."""

import torch

ALPHA = 1e-3
MIN_EXPECTED = 5.0


def g_test(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of counts [cells] drawn from probs [cells] (G-test). Cells expected fewer than
    MIN_EXPECTED times are pooled into one; a count in a cell of probability 0 gives p = 0."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    total = counts.sum()
    if bool(((probs <= 0) & (counts > 0)).any()):
        return 0.0
    expected = probs / probs.sum() * total
    small = expected < MIN_EXPECTED
    observed = torch.cat([counts[~small], counts[small].sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    cells = observed.numel()
    if cells < 2:
        return 1.0
    nonzero = observed > 0
    g = 2 * (observed[nonzero] * torch.log(observed[nonzero] / expected[nonzero])).sum()
    return float(torch.special.gammaincc(torch.tensor((cells - 1) / 2, dtype=torch.double), g / 2))
