"""The pipeline transfers of ``torch.distributed.pipelining``'s interleaved runtime
(``parallelism.pp_runtime: torch``), a mixin of :class:`~simulator.engine.sim.Engine`.

Each rank posts its transfers where :func:`simulator.parallel.torch_posts.posting_order`
places them, and they share the rank's one NCCL stream: a transfer starts after the one posted
before it on the rank has finished, and after the pass the rank posted before it (ProcessGroupNCCL
makes its stream wait for the compute stream when an operation is posted); a send and its
receive run together once both have started, for the collective model's time of a send; the
consuming pass waits for its receive. The host is taken to post ahead of the GPU (every
transfer is enqueued before the GPU reaches it), as it does in a GPU-bound step.
"""

from __future__ import annotations

import simpy

from simulator.engine.sends import CommSpec
from simulator.parallel.schedules import schedule
from simulator.parallel.torch_posts import Post, posting_order


class TorchPipelineSends:
    """Torch's P2P stream (uses the engine's ``plan``, ``env``, ``_recv_event``, ``_row``,
    ``comm_log``)."""

    def _torch_orders(self) -> dict[int, list[Post]]:
        """Every stage's posting order (built once per engine)."""
        hit = getattr(self, "_torch_posts", None)
        if hit is None:
            plan = self.plan
            orders = {s: schedule(plan.schedule_name, s, plan.pp, plan.microbatches,
                                  plan.virtual_stages) for s in range(plan.pp)}
            hit = self._torch_posts = posting_order(orders, plan.pp, plan.virtual_stages)
        return hit

    def _torch_post(self, p, order) -> list[simpy.Event]:
        """Post every transfer of process ``p`` on its stream; return one event per pass of
        ``order`` that the compute loop triggers when the pass ends."""
        posts = self._torch_orders()[p.stage]
        passes = [q.work for q in posts if q.kind == "C"]
        if passes != list(order):
            raise AssertionError("torch posting order does not follow the compute order")
        ends: list[simpy.Event] = []
        after = prev = None
        for q in posts:
            if q.kind == "C":
                after = self.env.event()
                ends.append(after)
                continue
            done = self.env.event()
            self.env.process(self._torch_transfer(p, q, after, prev, done))
            prev = done
        return ends

    def _torch_ready(self, key: tuple) -> simpy.Event:
        ev = self._torch_events.get(key)
        if ev is None:
            ev = self._torch_events[key] = self.env.event()
        return ev

    def _torch_transfer(self, p, q: Post, after, prev, done: simpy.Event):
        plan, env = self.plan, self.env
        if prev is not None:
            yield prev
        if after is not None:
            yield after
        if q.kind == "S":
            dst_vs = q.vs + 1 if q.phase == "F" else q.vs - 1
            dst = plan.peer(p, q.phase, dst_vs, q.vs // plan.pp)
            key = (q.phase, dst_vs, q.mb, dst)
        else:
            dst_vs, dst, key = q.vs, p.pid, (q.phase, q.vs, q.mb, p.pid)
        self._torch_ready(key + (q.kind,)).succeed()
        yield self._torch_ready(key + ("R" if q.kind == "S" else "S",))
        moved = self._torch_ready(key + ("moved",))
        if q.kind == "R":
            yield moved
            done.succeed()
            return
        name = f"{'act' if q.phase == 'F' else 'grad'} mb{q.mb} -> vs{dst_vs}"
        spec = CommSpec("pp", "pp_comm", "pp", "send", plan.pp_bytes, ("pp", p.pid, dst), name, -1,
                        q.mb)
        start = env.now
        yield env.process(plan.comm_exec(spec, p))
        self._row(p, "pp", "pp_comm", name, start, env.now, spec.nbytes, 0.0, -1, q.mb,
                  dim=spec.dim)
        self.comm_log.append((p, spec))
        plan.procs[dst].comm_iv["pp_in"].append((start, env.now))
        moved.succeed()
        self._recv_event(dst, q.phase, dst_vs, q.mb).succeed()
        done.succeed()
