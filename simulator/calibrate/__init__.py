"""Reproducible calibration: every fitted constant set of the catalog, refitted from the
measurement files in the repository, printed beside the value the catalog ships.

    python -m simulator.calibrate [network|alltoall|p2p|unaligned|launch|interference|memory|compute|host|routes|sync|deepep|host_spread|host_barrier|ports|power|kernel_bands|blockwise|blackwell_gemm|all]

| set | module | data | catalog |
|---|---|---|---|
| network: NVLink efficiency, launch, copy rate, intra-node ring step; the launch split; each box's host call interval of event-timed loops | :mod:`.network` | ``data/calibration/h200x4-nvswitch/collectives.jsonl`` (fit), ``data/measured/h100x2-nccl-device/tuning.jsonl`` (launch); call interval: ``data/calibration/h100x4-nvswitch/`` (4x H100), ``data/measured/h200x4/collectives.jsonl`` and ``h200x4-alltoall/alltoall.jsonl`` (4x H200) | ``simulator/network/fabrics.yaml``; ``gpus.yaml`` ``host_events_call_s``, ``host_events_peer_s`` (all-to-all's extra per peer: ``data/measured/a2a-probe-h100x4``) |
| NCCL's p2p warps: a piece's copy rate by its warps, 16-byte and narrow (send, receive); fitted with the all-to-all set below, reported here | :mod:`.p2p` | as the all-to-all set | ``fabrics.yaml`` ``nccl.all_to_all.p2p`` |
| NCCL's narrow copies (parts off a 16-byte boundary) | :mod:`.unaligned` | ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (misaligned uneven rows >= 64 MiB) | ``fabrics.yaml`` ``nccl.unaligned_copy_GBps`` |
| all-to-all within one NVLink domain, ten together: extra fixed cost per call, the port's one-way ceiling as a share of the NVLink rate, p2p Simple's fill, how the port and NCCL's warps combine, the six warp rates (fitted on device-bound rows only, each data set weighing alike) | :mod:`.alltoall` | ``data/measured/h100x2-nccl-device/tuning.jsonl`` (device-timed), ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (uniform rows >= 16 MiB, uneven >= 32 MiB), ``data/measured/a2a-probe-h100x4``, ``a2a-probe2-h100x4`` (tables >= 32 MiB), ``a2a-ports-h100x4``, ``a2a-pair-h100x4`` (>= 256 MiB, each launch on its p2p layout) | ``simulator/network/fabrics.yaml`` ``nccl.all_to_all`` |
| kernel launch gap, copy bandwidth | :mod:`.launch` | ``simulator/hardware/data/*/sync_vs_events.jsonl``, ``gemm.jsonl`` | ``gpus.yaml`` ``kernel_launch_s``, ``hbm_efficiency`` |
| compute slowed beside communication; communication slowed beside compute by GPU, operation, group and size | :mod:`.interference` | ``data/measured/h200x4/interference.jsonl``, ``data/measured/h100x4/comm_beside_compute-*.jsonl`` | ``fabrics.yaml`` ``compute_slowdown_beside_comm``, ``comm_slowdown_beside_compute`` |
| memory-bound access classes; the row-indexed bf16 kernels of Megatron-Core's PyTorch MoE permutation; PyTorch's multi-tensor optimizer kernels over bf16 (fused AdamW, foreach clip) | :mod:`.memory` | ``data/measured/h100x1``, ``data/measured/h200x1``; ``data/measured/moe-permute-h100x1``; ``data/measured/stepmech-h100x4/adam.jsonl`` | ``gpus.yaml`` ``memory_access`` |
| GEMM and flash-attention parameters; FlashAttention-2's | :mod:`.compute` | the ``calibration`` files of each GPU in ``gpus.yaml``; FA2: ``data/measured/h100x1`` and ``h200x4`` ``gemm.jsonl`` (FLASH_ATTENTION rows), ``data/published/fa3-paper-h100/fa2.jsonl`` | ``gpus.yaml`` ``gemm``, ``attention``, ``attention_fa2`` |
| the host's time per kernel and per collective call of eager model code, per MoE routing kernel, per FSDP2 collective call with its hook and per parameter tensor in it, per unit of a DTensor TP plan and per DTensor parameter in its optimizer step, per kernel Megatron-Core's MoE layer launches, per call of its unfused DeepEP routing map | :mod:`.host` | ``data/measured/tiny-h100x4/steps.jsonl`` (host-bound steps) and the simulator's op counts of the same configurations; ``data/measured/host-ops-h100x4/``; ``data/measured/fsdp-units-h100x2/``; ``data/measured/dtensor-host-h100x2/`` (DTensor TP per unit); ``data/measured/dtensor-step-host-h200x4/`` (DTensor's optimizer step); ``data/measured/megatron-moe-host-h100x2/`` (Megatron-Core's MoE layer); ``data/measured/multihot-host-h100x4/`` (its unfused DeepEP routing map) | ``gpus.yaml`` ``host_op_s``, ``host_collective_s``, ``host_sync_s``, ``host_moe_op_s``, ``host_engine_op_s``, ``host_fsdp_call_s``, ``host_fsdp_tensor_s``, ``host_fused_op_s``, ``host_fused_collective_s``, ``host_multihot_s``, ``host_dtensor``, ``host_dtensor_opt_*`` |
| a learned router's token correlation (how often an eager expert GEMM's row count is new): the default (a stable router) and the collapsing router of ``steps_alt.py`` | :mod:`.routes` | ``data/measured/diagnosis9-h100x4/`` (``expert_rows-*.json``: every MoE call's rows per local expert) | ``simulator/config/schema.py`` ``ROUTE_CORRELATION_DEFAULT``; ``steps_alt.py`` workloads' ``moe_route_correlation`` |
| the spread of GPUs' sustained speed that a group meeting at every layer pays (expected maximum of normals) | :mod:`.sync` | ``data/measured/sustained-h100x4/sustained-gpu*.jsonl`` (4x H100 at once, 65 ms windows) | ``gpus.yaml`` ``sync_jitter`` |
| the share of the modelled link rate DeepEP's normal dispatch and combine kernels reach | :mod:`.deepep` | ``data/published/deepep-v1-h800/normal.jsonl`` (DeepEP's README figures, H800) | ``simulator/engine/dispatch.py`` ``DEEPEP_RATE`` |
| the spread of per-process host speed that a host-bound step of n ranks pays (expected maximum of normals); the host rates fitted on steps of several ranks are divided by it (:mod:`.host`) | :mod:`.host_spread` | ``data/measured/host-spread-h100x4/*/host_spread-rank*.jsonl`` (1, 2 and 4 processes of one 4x H100 box, 0.2 s windows) | ``gpus.yaml`` ``host_jitter`` |
| what a host read after a collective of n ranks (an MoE layer's count synchronisations: a barrier of the EP group's hosts) costs beyond one process's read (expected maximum of normals) | :mod:`.host_barrier` | ``data/measured/sync-segments-h100x4/segments.jsonl.gz`` (1, 2 and 4 processes of one 4x H100 box, a host-bound stream cut into 4-256 segments by uneven all-to-alls, sizes read on the host or not) | ``gpus.yaml`` ``host_barrier_s`` |
| the SM clock under the power cap for a mix of GEMMs and memory-bound kernels (GEMM and memory-bound power at the boost clock, GEMM power per MHz, the clock-bound share of a GEMM's time) | :mod:`.power` | ``data/measured/stepmech-h100x4/`` (``clocks*.jsonl``, ``smi.csv``: shape AC's block GEMMs back to back, with adds or idle time between them, one H100 twice) | ``gpus.yaml`` ``power_clock`` |
| Hopper's block-scaled (DeepSeek-style 1x128 / 128x128) FP8 GEMMs against per-tensor FP8 at the same shapes: forward / dgrad and wgrad | :mod:`.blockwise` | ``data/measured/dsv3-fp8-h100x1/fp8_shapes.jsonl`` (DeepSeek-V3's GEMM shapes, sustained, one H100) | ``simulator/hardware/precision.py`` ``BLOCKWISE_RATE_HOPPER`` |
| Blackwell GEMM efficiencies (B200 fitted; GB200 and B300 by their MAMF efficiency over B200's; GB300 as GB200), at B200's sustained rate under its power cap | :mod:`.blackwell_gemm` | ``data/published/xla-matmul-table/matmul.jsonl`` (OpenXLA's GEMM cost table, H100 and B200, bf16 and FP8, rows of 4096^3 class and up), ``data/published/mamf-ml-engineering/mamf.jsonl`` (best MAMF shapes) | ``gpus.yaml`` ``gemm.eta``, ``gemm.eta_fp8`` of B200, GB200, B300, GB300 |
| the kernel bands per octave of rows of the data-gradient GEMMs of an eager expert backward (each band's first launch drains the GPU), and the host's time after such a drain | :mod:`.kernel_bands` | ``data/measured/gemm-drain-h100x4/drain-lazy.json`` (``steps_alt.py``'s expert GEMMs at 160 row counts, two widths, kernels named per call; 4x H100, cuBLAS 13) | ``simulator/model/kernel_first.py`` ``BANDS_PER_OCTAVE``, ``DRAIN_S`` |

Each module has ``refit() -> dict[name, (refitted, shipped)]``; ``tests/test_calibration.py``
checks that every shipped constant equals its refit within the rounding stated there. No
validation suite (``validation/``) is read by any of them.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines data file (blank lines skipped)."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
