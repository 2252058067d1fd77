"""The speed priors' old import path (`from gpuparity.checks import priors`), kept for callers
outside the library: the table is `gpuparity.priors`, which the selector (ops/select.py) ranks
by; verification never chooses. The same objects, so a change to PRIORS here is seen there."""
from ..priors import PRIORS, Order, family, order  # noqa: F401

__all__ = ["PRIORS", "Order", "family", "order"]
