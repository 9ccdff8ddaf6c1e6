"""ZeRO-3 / FSDP with the parameters all-gathered in FP8 (Megatron's `--fp8-param-gather`, torchtitan's float8
all-gather under FSDP2): half the bytes of the bf16 gather, the same FP8 bits the GEMMs would have made.

Which parameters: the weights of `Fp8Linear` layers, one flat of their own per unit (key `<unit>.fp8`); the rest of
the unit (norms, biases, the embedding, the LM head and, with `first_last_layers_bf16`, the first and last layers)
stays in its bf16 flat. Each rank holds a slice of the flat, which cuts through weights anywhere, so a scale that
covers a whole weight (per tensor) or a 128 x 128 block of it (blockwise) is agreed first:

    1. amax of my elements of each weight (per tensor) or of each block (blockwise), 0 where I hold none
    2. one all-reduce (max) of all of them over the shard group      -> the scale of the whole weight or block
    3. quantize my elements with their scale, all-gather the FP8 bytes (1 per element, against bf16's 2)
    4. hand each Fp8Linear its weight in FP8 (and its transpose: the same bits); the full buffer's bf16 views
       hold the dequantized values, for autograd's shapes and for a reader who looks

The agreed scale is the one the single-device layer computes from the whole weight and quantization is element by
element, so the gathered bits equal quantizing the gathered bf16 weight: the run is the bf16-gather run, bit for bit
(`tests/test_fp8_modes.py`). Delayed scaling records the agreed amax in the weight's history, as its single-device
layer records the whole weight's. The backward gathers again in FP8 with the forward's scales (no second
all-reduce) and the layer's dgrad reads that copy; the gradient is reduce-scattered in its own dtype (fp32 with
`grad_reduce="float32"`) into the fp32 master path, as without FP8. MXFP8 is refused by `Fp8Recipe`: its row-wise
and column-wise copies of W differ, so there is no one FP8 copy to gather.
"""

from __future__ import annotations

import torch

from pylib.model.fp8 import Fp8Linear, Fp8Tensor, fp8_dtype, scale_from_amax

from ..runtime import collectives as C

AMAX_TAG = "fp8.amax.param"


class Fp8ParamGather:
    """The FP8 all-gather of one flat of Fp8Linear weights: `flat` (a `pylib.dp.fsdp._Flat`) and `layers`, the
    layer that owns each of its entries in order."""

    def __init__(self, flat, layers: list[Fp8Linear]):
        self.flat, self.layers = flat, layers
        self.recipe = layers[0].recipe
        self.dtype = fp8_dtype("e4m3")
        self.scales: list[torch.Tensor] | None = None  # the last forward's, reused by its backward's gather
        for layer in layers:
            layer.regathers_weight = True  # its backward reads the copy gathered again
            layer.cache_weights = False  # and frees it after, as ZeRO-3 frees the unit

    # -- which of my elements belong to which weight and block ----------------------------------------------------
    def _pieces(self):
        """For each entry: (layer, entry, my elements' slice of the shard, their flat indices inside the weight)."""
        lo, hi = self.flat.layout.shard_range(self.flat.group.rank)
        for layer, e in zip(self.layers, self.flat.layout.entries):
            a, b = max(e.offset, lo), min(e.offset + e.numel, hi)
            yield layer, e, slice(a - lo, max(a, b) - lo), torch.arange(a - e.offset, max(a, b) - e.offset)

    def _block_ids(self, e, idx: torch.Tensor) -> torch.Tensor:
        t = self.recipe.block
        n_cols = e.shape[1]
        return (idx // n_cols // t) * (n_cols // t) + (idx % n_cols) // t

    def _agree(self, shard: torch.Tensor, tag) -> list[torch.Tensor]:
        """Steps 1-2: each weight's scale (per tensor: [] ; blockwise: [N/128, K/128]), agreed over the group."""
        amaxes = []
        for _, e, mine, idx in self._pieces():
            x = shard[mine].float().abs()
            if self.recipe.per_tensor:
                amaxes.append(x.amax().reshape(1) if x.numel() else torch.zeros(1))
            else:
                t = self.recipe.block
                grid = torch.zeros((e.shape[0] // t) * (e.shape[1] // t))
                amaxes.append(grid.scatter_reduce_(0, self._block_ids(e, idx), x, "amax"))
        agreed = C.all_reduce_(torch.cat(amaxes), self.flat.group, op="max", tag=f"{AMAX_TAG}.{tag}")
        scales, at = [], 0
        for (layer, e, _, _), piece in zip(self._pieces(), amaxes):
            amax = agreed[at : at + piece.numel()]
            at += piece.numel()
            if self.recipe.per_tensor:
                scales.append(layer.scale_for(amax.reshape(()), "weight").reshape(()))
            else:
                t = self.recipe.block
                scales.append(scale_from_amax(amax, self.dtype).view(e.shape[0] // t, e.shape[1] // t))
        return scales

    def _quantize(self, shard: torch.Tensor, scales) -> torch.Tensor:
        """Step 3's input: my shard in FP8 bytes (padding stays 0)."""
        top = float(torch.finfo(self.dtype).max)
        out = torch.zeros(shard.numel(), dtype=self.dtype)
        for (_, e, mine, idx), s in zip(self._pieces(), scales):
            if idx.numel():
                s_el = s if self.recipe.per_tensor else s.reshape(-1)[self._block_ids(e, idx)]
                out[mine] = (shard[mine].float() / s_el).clamp(-top, top).to(self.dtype)
        return out.view(torch.uint8)

    def gather(self, shard: torch.Tensor, tag, *, phase=None) -> torch.Tensor:
        """Steps 1-4 (the backward, `phase="backward"`, reuses the forward's scales): returns the full flat
        buffer [padded] in the shard's dtype, dequantized; each layer holds its FP8 weight."""
        if phase != "backward" or self.scales is None:
            self.scales = self._agree(shard, tag)
        full8 = C.all_gather_tensor(self._quantize(shard, self.scales), 0, self.flat.group, phase=phase, tag=tag)
        full8 = full8.view(self.dtype)
        full = torch.zeros(full8.numel(), dtype=shard.dtype)
        tile = None if self.recipe.per_tensor else (self.recipe.block, self.recipe.block)
        for layer, e, s in zip(self.layers, self.flat.layout.entries, self.scales):
            data = full8[e.offset : e.offset + e.numel].view(e.shape)
            q = Fp8Tensor(data, s, tuple(e.shape) if tile is None else tile)
            pair = (q, q.t())
            if phase == "backward":
                layer.weight_fp8 = pair  # what its dgrad reads
            else:
                layer.given_weight = pair  # what its forward uses instead of quantizing
            full[e.offset : e.offset + e.numel] = q.dequantize().reshape(-1).to(shard.dtype)
        return full

    def release(self) -> None:
        """After the unit's forward: the FP8 copies go with the gathered unit."""
        for layer in self.layers:
            layer.weight_fp8 = ()
            layer.given_weight = None


def fp8_weights(module: torch.nn.Module) -> dict[int, Fp8Linear]:
    """id(weight) -> its Fp8Linear, for every FP8 layer in `module`."""
    return {id(m.weight): m for m in module.modules() if isinstance(m, Fp8Linear)}


__all__ = ["AMAX_TAG", "Fp8ParamGather", "fp8_weights"]
