"""Run a function with torch's SDPA kernels that a known issue's fault lives in set aside.

An entry's `sidestep_sdpa` names the kernels (torch.nn.attention.SDPBackend names) whose fault
raises its `error_markers`. A function that calls F.scaled_dot_product_attention, run under
`sdpa_kernel` without them, takes another of torch's kernels for the same call and computes the
same attention; a function whose own code raised the error raises it again. checks/attribute.py
reruns an --impl's ERROR this way to tell torch's fault from the function's."""
from __future__ import annotations

import functools
from typing import Callable, Iterable, List

from .engine import SDPA_KERNELS, load_issues


def sdpa_set_aside(issue_ids: Iterable[str]) -> List[str]:
    """The SDPA kernels the issues `issue_ids` name in `sidestep_sdpa`, in SDPA_KERNELS order."""
    wanted = set(issue_ids)
    named = {name for issue in load_issues() if issue["id"] in wanted for name in issue.get("sidestep_sdpa", ())}
    return [name for name in SDPA_KERNELS if name in named]


def wrong_numbers_of(kernels: Iterable[str]) -> List[str]:
    """Ids of the known issues whose `wrong_sdpa` names one of torch's SDPA `kernels`: the silent
    wrong numbers the base knows of those kernels, in the base's order."""
    wanted = set(kernels)
    return [issue["id"] for issue in load_issues() if wanted & set(issue.get("wrong_sdpa", ()))]


def without_sdpa(fn: Callable, names: Iterable[str]) -> Callable:
    """`fn` with torch's SDPA kernels `names` set aside for every call it makes (its backward too:
    autograd keeps the kernel its forward chose); the math kernel always stays."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = set(names)
    unknown = names - set(SDPA_KERNELS)
    if unknown:
        raise ValueError(f"names: expected SDPA kernels from {SDPA_KERNELS}, got {sorted(unknown)}")
    keep = [getattr(SDPBackend, name) for name in SDPA_KERNELS if name not in names] + [SDPBackend.MATH]

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with sdpa_kernel(keep):
            return fn(*args, **kwargs)
    return wrapped
