"""Which FSDP2 units all-gather in forward and in backward, by ``reshard_after_forward``.

A CPU probe (gloo), no GPU needed: a 3-block model wrapped as the measuring scripts wrap theirs
(``fully_shard`` on every block, then on the root holding the embedding and the head), run
with ``reshard_after_forward`` passed as True (``steps.py``, ``steps_third.py``,
``measure.py``'s FSDP2 case), left out (``steps_alt.py``) and False (ZeRO-2-like), two steps
each; ``FSDPParamGroup.unshard`` is wrapped to log each unit whose call starts an all-gather,
and the type of the head's weight after the forward says whether the root was resharded (a
sharded ``DTensor``) or kept (a plain ``Parameter``). What it shows is
``simulator/engine/sim.py``'s ``_fsdp2_gather``; the output kept in
``data/measured/fsdp2-root-reshard-cpu/``.

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/fsdp2_root_reshard.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

LOG: list[tuple[str, str]] = []
PHASE = ["?"]
_unshard = pg.FSDPParamGroup.unshard


def _logged_unshard(self, async_op: bool = False):
    starts = self._all_gather_result is None and not self.is_unsharded
    _unshard(self, async_op)
    if starts and self._all_gather_result is not None:
        LOG.append((PHASE[0], self._module_fqn or "root"))


pg.FSDPParamGroup.unshard = _logged_unshard


class Block(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.lin = nn.Linear(h, h, bias=False)

    def forward(self, x):
        return x + self.lin(x)


class Model(nn.Module):
    def __init__(self, h: int = 16, vocab: int = 32, n: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h) for _ in range(n))
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, x):
        x = self.embed(x)
        for blk in self.layers:
            x = blk(x)
        return self.head(x)


def main() -> None:
    dist.init_process_group("gloo")
    for mode in ("passed True", "left out", "passed False"):
        torch.manual_seed(0)
        model = Model()
        kw = {} if mode == "left out" else {"reshard_after_forward": mode == "passed True"}
        for blk in model.layers:
            fully_shard(blk, **kw)
        fully_shard(model, **kw)
        x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
        for _ in range(2):
            LOG.clear()
            PHASE[0] = "fwd"
            logits = model(x)
            after_forward = type(model.head.weight).__name__
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            PHASE[0] = "bwd"
            loss.backward()
            model.zero_grad()
        if dist.get_rank() == 0:
            print(f"reshard_after_forward {mode}: head.weight after forward {after_forward}; "
                  f"all-gathers of the second step: {LOG}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
