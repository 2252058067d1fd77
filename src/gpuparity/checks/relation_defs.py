"""The second side of each equivalence relation (checks/relations.py), per op.

Each is `side(fn, args, kwargs, gen) -> output`: the same computation as `fn(*args, **kwargs)`
written another way (the batch item by item, the keys permuted, a paged cache gathered...),
its output mapped back onto the first call's. Built from the first call's tensors with
differentiable torch operations only (slices, permutations, exact scalings by powers of two,
concatenations), so autograd maps the gradients back as well: the gradient of each argument
under the second side must equal the gradient under the first. torch only, every helper at
module level: a standalone repro copies these functions in (checks/repro.py's source copier).
`NotApplicable` is raised where the call cannot take the relation."""
from __future__ import annotations

import torch


class NotApplicable(Exception):
    """The relation does not hold for this call (the check is a SKIP)."""


def _item(value, b, batch):
    """Item b of a per-item argument (its first dim is the batch), else the argument itself."""
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch and batch > 1:
        return value[b:b + 1]
    return value


def _permuted(t, perm, dim):
    return t.index_select(dim, perm.to(t.device))


# --------------------------------------------------------------------------- attention
def attention_batch_items(fn, args, kwargs, gen):
    """Each batch item alone (B calls of B = 1), concatenated."""
    q, k, v = args[0], args[1], args[2]
    batch = q.shape[0]
    outs = []
    for b in range(batch):
        item = {}
        for name, value in kwargs.items():
            if name == "attn_mask" and value is not None and value.dim() == 4 and value.shape[0] > 1:
                value = value[b:b + 1]
            elif name in ("key_padding_mask", "alibi_slopes") and value is not None and value.dim() == 2:
                value = _item(value, b, batch)
            item[name] = value
        outs.append(fn(q[b:b + 1], k[b:b + 1], v[b:b + 1], *args[3:], **item))
    return torch.cat(outs)


def attention_key_permutation(fn, args, kwargs, gen):
    """Keys, values, their mask columns and key padding permuted together."""
    q, k, v = args[0], args[1], args[2]
    keys = k.shape[-2]
    perm = torch.randperm(keys, generator=gen)
    mask, padding = kwargs.get("attn_mask"), kwargs.get("key_padding_mask")
    other = dict(kwargs)
    if mask is not None and mask.shape[-1] == keys:
        other["attn_mask"] = _permuted(mask, perm, mask.dim() - 1)
    if padding is not None:
        other["key_padding_mask"] = _permuted(padding, perm, 1)
    return fn(q, _permuted(k, perm, 2), _permuted(v, perm, 2), *args[3:], **other)


def attention_scale_fold(fn, args, kwargs, gen):
    """q / 4 with 4x the scale: powers of two, exact in every dtype."""
    q = args[0]
    scale = kwargs.get("scale")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return fn(q / 4, *args[1:], **{**kwargs, "scale": scale * 4})


def attention_gqa_repeat(fn, args, kwargs, gen):
    """Grouped KV heads repeated to one per query head."""
    q, k, v = args[0], args[1], args[2]
    group = q.shape[1] // k.shape[1]
    if group == 1:
        raise NotApplicable("no grouped heads")
    return fn(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), *args[3:], **kwargs)


def attention_causal_band(fn, args, kwargs, gen):
    """is_causal spelled as its band: a bool attn_mask (top-left, as is_causal)."""
    q, k = args[0], args[1]
    if not kwargs.get("is_causal") or kwargs.get("attn_mask") is not None:
        raise NotApplicable("needs is_causal and no attn_mask")
    band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return fn(*args, **{**kwargs, "attn_mask": band, "is_causal": False})


PADDING = 5


def attention_padding_appended(fn, args, kwargs, gen):
    """PADDING random keys appended and masked out by the key padding mask (made where absent)."""
    q, k, v = args[0], args[1], args[2]
    batch, keys = k.shape[0], k.shape[-2]

    def extra(t):
        noise = torch.randn(*t.shape[:-2], PADDING, t.shape[-1], generator=gen, dtype=torch.float64)
        return torch.cat([t, noise.to(t.device, t.dtype)], -2)
    padding = kwargs.get("key_padding_mask")
    padding = torch.zeros(batch, keys, dtype=torch.bool, device=q.device) if padding is None else padding
    padding = torch.cat([padding, torch.ones(batch, PADDING, dtype=torch.bool, device=q.device)], 1)
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.shape[-1] == keys:
        if mask.dtype == torch.bool:
            pad = torch.zeros(*mask.shape[:-1], PADDING, dtype=torch.bool, device=mask.device)
        else:
            pad = torch.full((*mask.shape[:-1], PADDING), float("-inf"), dtype=mask.dtype, device=mask.device)
        mask = torch.cat([mask, pad], -1)
    return fn(q, extra(k), extra(v), *args[3:], **{**kwargs, "attn_mask": mask, "key_padding_mask": padding})


def contiguous_copy(fn, args, kwargs, gen):
    """Every tensor argument as a contiguous copy of the view the caller passed."""
    def copy(value):
        return value.contiguous() if isinstance(value, torch.Tensor) else value
    if all(not isinstance(a, torch.Tensor) or a.is_contiguous() for a in list(args) + list(kwargs.values())):
        raise NotApplicable("every tensor argument is contiguous already")
    return fn(*[copy(a) for a in args], **{name: copy(value) for name, value in kwargs.items()})


# --------------------------------------------------------------------------- rms_norm, layer_norm
def norm_rows_split(fn, args, kwargs, gen):
    """The rows in two calls (split at a seeded row of the first dim), concatenated."""
    x, shape = args[0], args[1]
    dims = 1 if isinstance(shape, int) else len(shape)
    if x.dim() <= dims or x.shape[0] < 2:
        raise NotApplicable("needs two or more rows in the first dim")
    cut = int(torch.randint(1, x.shape[0], (1,), generator=gen))
    return torch.cat([fn(x[:cut], *args[1:], **kwargs), fn(x[cut:], *args[1:], **kwargs)])


def norm_features_permuted(fn, args, kwargs, gen):
    """The normalized features permuted in x, weight and bias alike; the output permuted back."""
    x, shape = args[0], args[1]
    dims = 1 if isinstance(shape, int) else len(shape)
    width = 1
    for size in x.shape[x.dim() - dims:]:
        width *= size
    perm = torch.randperm(width, generator=gen)
    inverse = torch.argsort(perm)

    def features(t, lead):
        flat = t.reshape(*t.shape[:lead], width)
        return _permuted(flat, perm, lead).reshape(t.shape)
    rest = [features(a, 0) if isinstance(a, torch.Tensor) and a.dim() == dims and a.numel() == width else a
            for a in args[2:]]
    out = fn(features(x, x.dim() - dims), shape, *rest, **kwargs)
    flat = out.reshape(*out.shape[:out.dim() - dims], width)
    return _permuted(flat, inverse, out.dim() - dims).reshape(out.shape)


# --------------------------------------------------------------------------- rotary
def rotary_items_offsets_folded(fn, args, kwargs, gen):
    """Each sequence alone with its position offset folded into the table (cos[o:], sin[o:])
    and seqlen_offsets 0, concatenated."""
    x, cos, sin = args[0], args[1], args[2]
    offsets, bounds = kwargs.get("seqlen_offsets", 0), kwargs.get("cu_seqlens")
    rest = {name: value for name, value in kwargs.items() if name not in ("seqlen_offsets", "cu_seqlens", "max_seqlen")}
    count = x.shape[0] if bounds is None else bounds.numel() - 1
    outs = []
    for b in range(count):
        offset = int(offsets[b]) if isinstance(offsets, torch.Tensor) else int(offsets)
        if bounds is None:
            outs.append(fn(x[b:b + 1], cos[offset:], sin[offset:], seqlen_offsets=0, **rest))
            continue
        start, stop = int(bounds[b]), int(bounds[b + 1])
        if stop == start:
            continue
        one = torch.tensor([0, stop - start], dtype=bounds.dtype, device=bounds.device)
        outs.append(fn(x[start:stop], cos[offset:], sin[offset:], seqlen_offsets=0, cu_seqlens=one,
                       max_seqlen=stop - start, **rest))
    return torch.cat(outs)


def rotary_heads_permuted(fn, args, kwargs, gen):
    """The heads permuted (dim -2 of x); the output permuted back."""
    x = args[0]
    heads = x.shape[-2]
    if heads < 2:
        raise NotApplicable("one head")
    perm = torch.randperm(heads, generator=gen)
    out = fn(_permuted(x, perm, x.dim() - 2), *args[1:], **kwargs)
    return _permuted(out, torch.argsort(perm), out.dim() - 2)


# --------------------------------------------------------------------------- attention_varlen
def varlen_sequences_alone(fn, args, kwargs, gen):
    """Each packed sequence as a call of its own (cu_seqlens [0, L]), concatenated."""
    q, k, v, bounds_q, bounds_k = args[0], args[1], args[2], args[3], args[4]
    count = bounds_q.numel() - 1
    outs = []
    for b in range(count):
        qs, qe, ks, ke = int(bounds_q[b]), int(bounds_q[b + 1]), int(bounds_k[b]), int(bounds_k[b + 1])
        if qe == qs:
            continue
        if ke == ks:   # no keys: zero rows (the contract), not a call with empty tensors
            outs.append(q.new_zeros(qe - qs, q.shape[1], v.shape[-1]))
            continue
        item = dict(kwargs)
        if item.get("alibi_slopes") is not None:
            item["alibi_slopes"] = _item(item["alibi_slopes"], b, count) if item["alibi_slopes"].dim() == 2 \
                else item["alibi_slopes"]
        one_q = torch.tensor([0, qe - qs], dtype=bounds_q.dtype, device=bounds_q.device)
        one_k = torch.tensor([0, ke - ks], dtype=bounds_k.dtype, device=bounds_k.device)
        outs.append(fn(q[qs:qe], k[ks:ke], v[ks:ke], one_q, one_k, qe - qs, ke - ks, **item))
    if not outs:
        raise NotApplicable("no sequence has query rows")
    return torch.cat(outs)


# --------------------------------------------------------------------------- attention_decode
def decode_paged_gathered(fn, args, kwargs, gen):
    """A paged cache against the same keys gathered into a contiguous cache (no block_table)."""
    q, k_pool, v_pool, lengths = args[0], args[1], args[2], args[3]
    table = kwargs.get("block_table")
    if table is None:
        raise NotApplicable("not a paged call")

    def gather(pool):
        blocks, heads, page, dim = pool.shape
        pages = pool[table.long().reshape(-1)].view(table.shape[0], table.shape[1], heads, page, dim)
        return pages.transpose(1, 2).reshape(table.shape[0], heads, table.shape[1] * page, dim)
    rest = {name: value for name, value in kwargs.items() if name != "block_table"}
    return fn(q, gather(k_pool), gather(v_pool), lengths, **rest)


def decode_batch_items(fn, args, kwargs, gen):
    """Each batch item alone (its cache, or its row of the block table over the same pool)."""
    q, k_cache, v_cache, lengths = args[0], args[1], args[2], args[3]
    batch = q.shape[0]
    table = kwargs.get("block_table")
    outs = []
    for b in range(batch):
        item = {name: (_item(value, b, batch) if name in ("block_table", "alibi_slopes") and value is not None
                       and value.dim() == 2 else value) for name, value in kwargs.items()}
        caches = (k_cache, v_cache) if table is not None else (k_cache[b:b + 1], v_cache[b:b + 1])
        outs.append(fn(q[b:b + 1], caches[0], caches[1], lengths[b:b + 1], **item))
    return torch.cat(outs)


# --------------------------------------------------------------------------- cross_entropy
def _ce_ignore(kwargs):
    return kwargs.get("ignore_index", -100)


def _ce_count(target, kwargs) -> int:
    return int((target != _ce_ignore(kwargs)).sum())


def ce_rows_split(fn, args, kwargs, gen):
    """The rows in two calls (split at a seeded row): 'none' concatenated, 'sum' added, 'mean'
    the two means weighted by their rows that are not ignored (a half without any left out)."""
    logits, target = args[0], args[1]
    rows = logits.shape[0]
    if rows < 2:
        raise NotApplicable("needs two or more rows")
    cut = int(torch.randint(1, rows, (1,), generator=gen))
    halves = [(logits[:cut], target[:cut]), (logits[cut:], target[cut:])]
    reduction = kwargs.get("reduction", "mean")
    outs = [fn(part, labels, *args[2:], **kwargs) for part, labels in halves]
    if reduction == "none":
        return torch.cat(outs)
    if reduction == "sum":
        return (outs[0].float() + outs[1].float()).to(outs[0].dtype)
    counts = [_ce_count(labels, kwargs) for _, labels in halves]
    if sum(counts) == 0:
        raise NotApplicable("every row is ignored")
    total = sum(out.float() * count for out, count in zip(outs, counts) if count)
    return (total / sum(counts)).to(outs[0].dtype)


def ce_rows_permuted(fn, args, kwargs, gen):
    """The rows (logits and target together) permuted; 'none' permuted back."""
    logits, target = args[0], args[1]
    perm = torch.randperm(logits.shape[0], generator=gen)
    out = fn(_permuted(logits, perm, 0), _permuted(target, perm, 0), *args[2:], **kwargs)
    return _permuted(out, torch.argsort(perm), 0) if kwargs.get("reduction", "mean") == "none" else out


def ce_logit_shift(fn, args, kwargs, gen, reach=64):
    """A constant added to each row's logits (a seeded integer per row, up to `reach` either way;
    contracts/basic.py CE_SHIFT_REACH, which the floor allows for): the softmax, the loss and the
    gradient do not change."""
    logits = args[0]
    shift = torch.randint(-reach, reach + 1, (logits.shape[0], 1), generator=gen).to(logits.device, logits.dtype)
    return fn(logits + shift, *args[1:], **kwargs)


def ce_ignored_rows_appended(fn, args, kwargs, gen, count=5):
    """`count` random rows appended with target ignore_index: 'sum' and 'mean' unchanged, 'none'
    the same rows (the appended ones dropped)."""
    logits, target = args[0], args[1]
    noise = torch.randn(count, logits.shape[1], generator=gen, dtype=torch.float64) * 4
    more = torch.cat([logits, noise.to(logits.device, logits.dtype)])
    labels = torch.cat([target, torch.full((count,), _ce_ignore(kwargs), dtype=target.dtype,
                                           device=target.device)])
    out = fn(more, labels, *args[2:], **kwargs)
    return out[:logits.shape[0]] if kwargs.get("reduction", "mean") == "none" else out


def ce_reduced_from_none(fn, args, kwargs, gen):
    """'sum' and 'mean' against reduction='none' summed in fp32 (divided by the rows not ignored)."""
    logits, target = args[0], args[1]
    reduction = kwargs.get("reduction", "mean")
    if reduction == "none":
        raise NotApplicable("reduction='none'")
    rows = fn(*args, **{**kwargs, "reduction": "none"})
    total = rows.float().sum()
    if reduction == "mean":
        count = _ce_count(target, kwargs)
        if count == 0:
            raise NotApplicable("every row is ignored")
        total = total / count
    return total.to(rows.dtype)
