"""Multi-token prediction (``model.mtp_depth``): DeepSeek-V3's MTP modules (arXiv:2412.19437,
Section 2.2) as Megatron-Core builds them (``megatron/core/transformer/
multi_token_prediction.py``).

Module ``d`` takes the main model's last hidden state and the embedding of the token ``d``
places ahead, normalises both (``hnorm``, ``enorm``), concatenates them and projects ``2h ->
h`` (``eh_proj``, a column-parallel linear whose input is gathered from the
sequence-parallel region and whose output is gathered back over TP), runs one transformer
layer of the model's last kind (an MoE layer in DeepSeek-V3) and the LM head and loss it
shares with the main model. Everything runs on the last pipeline stage, after the main
head, so a stage that also holds layers carries ``mtp_depth`` more layers and heads than
the others: pipeline layouts give the MTP its own stage (Megatron-Bridge's DeepSeek-V3
layout ``...|mL``). Pure functions; the engine adds these ops to the head's programs.
"""

from __future__ import annotations

from simulator.config.schema import ModelConfig
from simulator.model.comm import comm_op, cp_local
from simulator.model.ops import gemm_grads, gemm_op, local_dims, mem_op


def proj_ops(model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool,
             backward: bool, cp: int = 1, d: int = 2) -> list:  # fmt: skip
    """One module's two norms and its ``eh_proj`` ``[b*s, 2h] @ [2h, h/tp]`` on one rank
    (the embedding lookup and the layer are the model's own ops). With TP the projection's
    ``2h`` input is all-gathered from the sequence-parallel region (reduce-scattered in the
    backward) and its ``h/tp`` output gathered over TP (split again in the backward)."""
    local = cp_local(model, cp)
    L, h = local_dims(local, micro_batch, tp, sequence_parallel), local.hidden
    proj = gemm_op("mtp_eh_proj", "mtp", L.tokens, 2 * h, -(-h // tp), d)
    norms = mem_op("mtp_norms", "mtp", 2 * 2 * L.norm_tokens * h * d, bwd=backward)
    gather_in = L.tokens * 2 * h * d  # the gathered [b*s, 2h] input, bytes
    if not backward:
        ops = [norms]
        if tp > 1 and sequence_parallel:
            ops.append(comm_op("tp_all_gather", "all_gather", "tp", gather_in))
        ops.append(proj)
        if tp > 1:
            ops.append(comm_op("tp_all_gather", "all_gather", "tp", L.tokens * h * d))
        return ops
    ops = gemm_grads(proj, d)
    if tp > 1:
        c = "reduce_scatter" if sequence_parallel else "all_reduce"
        ops.append(comm_op(f"tp_{c}", c, "tp", gather_in))
    return [*ops, norms]


def mtp_params(model: ModelConfig, layer_params: int) -> int:
    """Parameters of the MTP modules beyond the shared embedding and head: per module one
    layer (``layer_params``), ``eh_proj`` (``2 h^2``) and the two norms' gains (``2 h``)."""
    h = model.hidden
    return model.mtp_depth * (layer_params + 2 * h * h + 2 * h)
