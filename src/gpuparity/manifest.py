"""The op manifest: every op gpuparity defines, one line each, and everything derived from it.

A line names the op's contract (its module under contracts/ and the `OpSpec` in it), the modules
that register its backends, in the op's order (the order `dispatch.backends(op)` lists them and the
order that breaks ties when auto ranks them; "contract" is the slot where its contract's
`COMPOSITIONS` are registered), and its public functions (their module under ops/ and their names;
empty for the ops the battery alone runs). From it come `contracts.CONTRACTS` (the battery's ops, in
the manifest's order), `backends.MODULES` (one order that keeps every line's, `registration_order`:
`backends.load` imports the lines of the ops asked for in it, each module once, under its lock)
and the op exports of `gpuparity`'s lazy facade. A base piece: it imports nothing, so `import gpuparity` reads it at no cost.

Adding an op: its contract, its kernel module, its public function in ops/, and one line here.
"""


class Op:
    """One op's line (a plain class, not a namedtuple: `import gpuparity` reads this module, and
    building a namedtuple class costs it about 0.1 ms)."""
    __slots__ = ("name", "contract", "backends", "exports")

    def __init__(self, name, contract, backends, exports):
        self.name, self.contract, self.backends, self.exports = name, contract, backends, exports

    def __repr__(self):
        return f"Op({self.name!r}, {self.contract!r}, {self.backends!r}, {self.exports!r})"


CONTRACT = "contract"   # a backend slot: the op's contract module (its COMPOSITIONS)

# Op(name, "contract module:OpSpec name", "backend modules, the op's order", "ops module: public names")
OPS = (
    Op("attention", "attention:SPEC", "sdpa contract triton_attention flex", "attention: attention attention_dropout_mask"),
    Op("softmax", "basic:SOFTMAX_SPEC", "torch_ops contract", ""),
    Op("layer_norm", "norms:LN_SPEC", "torch_ops contract triton_norms compiled", "norms: layer_norm"),
    Op("rms_norm", "norms:RMS_SPEC", "torch_ops contract triton_norms compiled", "norms: rms_norm"),
    Op("rotary", "rotary:SPEC", "contract triton_rotary compiled", "rotary: apply_rotary"),
    Op("matmul", "basic:MATMUL_SPEC", "torch_ops contract", ""),
    Op("conv2d", "basic:CONV2D_SPEC", "torch_ops contract", ""),
    Op("cross_entropy", "basic:CROSS_ENTROPY_SPEC", "torch_ops contract triton_cross_entropy", ""),
    Op("attention_varlen", "varlen:SPEC", "triton_attention contract", "varlen: attention_varlen"),
    Op("attention_decode", "decode:SPEC", "triton_decode contract", "decode: attention_decode kv_cache_append"),
    Op("linear_cross_entropy", "linear_cross_entropy:SPEC", "ce_composition triton_cross_entropy",
       "linear_cross_entropy: linear_cross_entropy"),
    Op("swiglu", "swiglu:SPEC", "torch_ops contract triton_swiglu", "swiglu: swiglu"),
    Op("residual_norm", "residual_norm:SPEC", "contract triton_residual_norm", "residual_norm: residual_norm"),
)


def contract_of(op: Op) -> tuple:
    """(the contract's module, its OpSpec's name)."""
    module, _, spec = op.contract.partition(":")
    return f"gpuparity.contracts.{module}", spec


def backend_modules(op: Op) -> tuple:
    """The modules that register `op`'s backends, in the op's order."""
    return tuple(contract_of(op)[0] if word == CONTRACT else f"gpuparity.backends.{word}"
                 for word in op.backends.split())


def contracts(ops=OPS) -> dict:
    """op -> (contract module, OpSpec name), in the manifest's order (the battery's)."""
    return {op.name: contract_of(op) for op in ops}


def exports(ops=OPS) -> dict:
    """public name -> the ops module that defines it."""
    found = {}
    for op in ops:
        module, _, names = op.exports.partition(":")
        found.update((name, f"gpuparity.ops.{module.strip()}") for name in names.split())
    return found


def registration_order(ops=OPS) -> tuple:
    """Every module of every line, each once, in one order that keeps each line's order (so each op
    lists its backends as its line does, whatever other ops share a module); where lines leave two
    modules unordered, the one named first in the manifest comes first. ValueError when two lines
    order the same modules both ways."""
    after = {}     # module -> the modules that must come after it
    for op in ops:
        line = backend_modules(op)
        for module in line:
            after.setdefault(module, [])
        for earlier, later in zip(line, line[1:]):
            after[earlier].append(later)
    waiting = {module: 0 for module in after}
    for laters in after.values():
        for later in laters:
            waiting[later] += 1
    order = []
    while len(order) < len(after):
        ready = next((m for m in after if waiting[m] == 0 and m not in order), None)   # first named first
        if ready is None:
            stuck = sorted(m for m in after if m not in order)
            raise ValueError(f"manifest: the backend lines order these modules both ways: {', '.join(stuck)}; "
                             "need one order that keeps every op's line")
        order.append(ready)
        for later in after[ready]:
            waiting[later] -= 1
    return tuple(order)
