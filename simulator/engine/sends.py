"""Pipeline point-to-point sends of the engine (:class:`~simulator.engine.sim.Engine`), and
the record of a collective or send a process issues (:class:`CommSpec`).

A send of activations (forward) or gradients (backward) to the neighbouring virtual stage
runs on the sender's ``pp`` stream, one after another in issue order. In folded detail, where
its stream is free and it cannot join the flow network at this instant (its links carry no
other traffic, or only data-parallel / ZeRO traffic and none is running or about to start),
its time is known when it is issued: its row is written then and the receiver's event itself
is scheduled at its end (one SimPy event). Every other send runs as a process that waits for
the stream, then takes the collective model's cost, or runs in the flow network beside other
traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import simpy
from simpy.events import NORMAL


@dataclass(frozen=True)
class CommSpec:
    """A collective (or send) that one process issues on a stream."""

    stream: str  # dp | gather | edp | egather | pp, or a dimension (tp, cp) in full detail
    kind: str  # breakdown kind: <dim>_comm | zero_gather
    dim: str  # the layout dimension(s) of its group (the events' ``dim``: tp, cp+dp, edp, pp)
    op: str
    nbytes: float
    key: tuple  # rendezvous key shared by every participant
    name: str
    layer: int = -1
    microbatch: int = -1


class PipelineSends:
    """The engine's pipeline sends (a mixin of :class:`~simulator.engine.sim.Engine`: it uses
    the engine's ``plan``, ``env``, ``_recv_event``, ``_row``, ``rows``, ``comm_log``,
    ``_last_done``, ``_routes``, ``_send_ways``, ``_send_static_cache``, ``_dp_running`` and
    ``_dp_starting``)."""

    def _send(self, p, phase: str, vs: int, mb: int, chunk: int = 0) -> None:
        """Send activations (F) to the next or gradients (B) to the previous virtual stage
        (on the rank that runs it for the micro-batches of ``chunk``: DualPipe's two
        directions)."""
        route = self._routes.get((p.pid, phase, vs, chunk))
        if route is None:  # (destination process and stage, the row's name around mb)
            dst_vs = vs + 1 if phase == "F" else vs - 1
            route = self._routes[(p.pid, phase, vs, chunk)] = (
                self.plan.peer(p, phase, dst_vs, chunk), dst_vs,
                "act mb" if phase == "F" else "grad mb", f" -> vs{dst_vs}")  # fmt: skip
        dst, dst_vs, head, tail = route
        recv = self._recv_event(dst, phase, dst_vs, mb)
        if dst == p.pid:  # the next stage is on this rank (DualPipeV's turn): nothing moves
            recv.succeed()
            return
        name = f"{head}{mb}{tail}"
        prev = self._last_done.get((p.pid, "pp"))
        if self._static_send_now(p, dst, prev):
            self._send_static(p, dst, name, mb, recv)
            return
        spec = CommSpec("pp", "pp_comm", "pp", "send", self.plan.pp_bytes, ("pp", p.pid, dst), name,
                        -1, mb)
        done = self.env.event()
        self._last_done[(p.pid, "pp")] = done
        self.env.process(self._run_send(p, dst, spec, prev, done, recv))

    def _static_send_now(self, p, dst: int, prev) -> bool:
        """Whether a send issued now starts now and takes its static (folded) cost for sure:
        its stream is free, and it would not join the flow network -- never for its links, or
        only beside DP / ZeRO traffic while none is running or about to start at this instant
        (a collective process created but not started yet). :meth:`_run_send` would decide
        the same when it starts, at this instant; this path spares its process and events."""
        plan = self.plan
        if plan.detail != "folded" or (prev is not None and not prev.processed):
            return False
        ways = self._send_ways.get((p.pid, dst))
        if ways is None:  # (in the network beside DP traffic, without)
            net = plan.send_in_network
            ways = self._send_ways[(p.pid, dst)] = (
                (False, False) if net is None else (net(p, dst, True), net(p, dst, False)))
        if not ways[0]:
            return True
        return not ways[1] and self._dp_running == 0 and self._dp_starting == 0

    def _send_static(self, p, dst: int, name: str, mb: int, recv: simpy.Event) -> None:
        """:meth:`_run_send` without a process: its records made now (its end is known), the
        receive event itself scheduled at the send's end (as a Timeout is) and kept as the
        stream's last send."""
        hit = self._send_static_cache.get((p.pid, dst))
        if hit is None:  # (the log's spec: what link accounting reads -- stream, op, bytes)
            spec = CommSpec("pp", "pp_comm", "pp", "send", self.plan.pp_bytes, ("pp", p.pid, dst),
                            "send")  # fmt: skip
            hit = self._send_static_cache[(p.pid, dst)] = (
                spec, self.plan.comm_time(spec, p), self.plan.procs[dst].comm_iv["pp_in"])
        spec, dur, pp_in = hit
        start = self.env.now
        end = start + dur  # the time SimPy gives the event below
        self.rows.append((p.gpu, p.label, p.stage, "pp", "pp_comm", "pp", name, start, end,
                          spec.nbytes, 0.0, -1, mb, 1, ""))  # (as :meth:`_row` writes it)
        self.comm_log.append((p, spec))
        pp_in.append((start, end))
        recv._ok = True
        recv._value = None
        self.env.schedule(recv, NORMAL, dur)
        self._last_done[(p.pid, "pp")] = recv

    def _run_send(self, p, dst: int, spec: CommSpec, prev, done, recv):
        env = self.env
        if prev is not None and not prev.processed:
            yield prev
        if self.plan.send_in_network and self.plan.send_in_network(p, dst, self._dp_running > 0):
            spec = replace(spec, op="send_flows")  # beside other traffic: in the flow network
        start = env.now
        if self.plan.comm_exec is not None:
            yield env.process(self.plan.comm_exec(spec, p))
        else:
            yield env.timeout(self.plan.comm_time(spec, p))
        self._row(p, "pp", "pp_comm", spec.name, start, env.now, spec.nbytes, 0.0, -1,
                  spec.microbatch, dim=spec.dim)
        self.comm_log.append((p, spec))
        dst_proc = self.plan.procs[dst]
        dst_proc.comm_iv["pp_in"].append((start, env.now))
        done.succeed()
        recv.succeed()
