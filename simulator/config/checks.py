"""Cross-field rules: the workload against itself and against the cluster it runs on.

Each rule raises :class:`ConfigError` naming the workload file and the dotted field to change,
with the numbers that disagree and what would be accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.config.schema import TopologyConfig, WorkloadConfig
from simulator.errors import ConfigError


@dataclass(frozen=True)
class Resolved:
    """Derived sizes every later stage needs (all validated)."""

    n_gpus: int
    tp: int
    pp: int
    dp: int
    virtual_stages: int
    microbatches: int  # per DP rank per step
    stage_layers: tuple[int, ...]  # layers per virtual stage, pp * virtual_stages entries


def resolve(
    work: WorkloadConfig, topo: TopologyConfig, *, file: str, topo_file: str | None = None
) -> Resolved:
    """Check the workload against the cluster and derive the layout sizes."""
    m, t, par = work.model, work.training, work.parallelism
    n_gpus = topo.nodes * topo.gpus_per_node
    tp, pp = par.tp, par.pp

    def fail(field: str, msg: str) -> ConfigError:
        return ConfigError(msg, file=file, field=field)

    if par.dp is None:
        if n_gpus % (tp * pp):
            raise fail(
                "parallelism.tp",
                f"tp*pp = {tp * pp} does not divide the cluster's {n_gpus} GPUs",
            )
        dp = n_gpus // (tp * pp)
    else:
        dp = par.dp
        if tp * pp * dp != n_gpus:
            raise fail(
                "parallelism.dp",
                f"tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}, but the cluster "
                f"'{topo.name}' has {n_gpus} GPUs ({topo.nodes} nodes x {topo.gpus_per_node}); "
                f"they must be equal (e.g. dp={n_gpus // (tp * pp)})"
                if n_gpus % (tp * pp) == 0
                else f"tp*pp*dp = {tp * pp * dp}, but the cluster '{topo.name}' has {n_gpus} GPUs",
            )
    if m.heads % tp:
        raise fail("parallelism.tp", f"heads={m.heads} is not divisible by tp={tp}")
    kv = m.n_kv_heads
    if kv % tp and tp % kv:
        raise fail(
            "parallelism.tp",
            f"kv_heads={kv} and tp={tp}: one must divide the other (KV heads are split or replicated)",
        )
    if m.ffn % tp:
        raise fail("parallelism.tp", f"ffn_hidden={m.ffn} is not divisible by tp={tp}")
    if par.sequence_parallel and m.seq_len % tp:
        raise fail(
            "parallelism.sequence_parallel",
            f"seq_len={m.seq_len} is not divisible by tp={tp}",
        )

    v = par.virtual_stages
    if par.pp_schedule != "interleaved" and v != 1:
        raise fail(
            "parallelism.virtual_stages",
            f"virtual_stages={v} needs pp_schedule: interleaved (got {par.pp_schedule})",
        )
    if par.pp_schedule == "interleaved" and pp == 1:
        raise fail("parallelism.pp_schedule", "interleaved needs pp > 1")
    n_virtual = pp * v
    if par.stage_layers is not None:
        sl = tuple(par.stage_layers)
        if len(sl) != n_virtual:
            raise fail(
                "parallelism.stage_layers",
                f"has {len(sl)} entries, expected pp*virtual_stages = {n_virtual}",
            )
        if sum(sl) != m.layers:
            raise fail(
                "parallelism.stage_layers",
                f"adds up to {sum(sl)} layers, but model.layers = {m.layers}",
            )
    else:
        if m.layers % n_virtual:
            raise fail(
                "parallelism.pp",
                f"model.layers={m.layers} is not divisible by pp*virtual_stages={n_virtual} "
                "(give parallelism.stage_layers to split unevenly)",
            )
        sl = (m.layers // n_virtual,) * n_virtual

    per_step = dp * t.micro_batch
    if t.global_batch % per_step:
        raise fail(
            "training.global_batch",
            f"global_batch={t.global_batch} is not divisible by dp*micro_batch = {dp}*"
            f"{t.micro_batch} = {per_step}",
        )
    mbs = t.global_batch // per_step
    if par.pp_schedule == "interleaved" and mbs % pp:
        raise fail(
            "training.global_batch",
            f"the interleaved schedule needs micro-batches ({mbs}) to be a multiple of pp={pp}",
        )
    if par.zero >= 1 and dp == 1:
        pass  # legal, ZeRO over one rank is plain data parallel
    for i, s in enumerate(work.faults.stragglers):
        if s.gpu is not None and s.gpu >= n_gpus:
            raise fail(
                f"faults.stragglers[{i}].gpu",
                f"gpu {s.gpu} does not exist (the cluster has GPUs 0..{n_gpus - 1})",
            )
        if s.node is not None and s.node >= topo.nodes:
            raise fail(
                f"faults.stragglers[{i}].node",
                f"node {s.node} does not exist (the cluster has nodes 0..{topo.nodes - 1})",
            )
    for i, lf in enumerate(work.faults.links):
        if lf.kind == "nvlink":
            if lf.gpu is None or lf.gpu >= n_gpus:
                raise fail(
                    f"faults.links[{i}].gpu", f"an nvlink fault needs gpu in 0..{n_gpus - 1}"
                )
        else:
            if lf.node is None or lf.node >= topo.nodes:
                raise fail(
                    f"faults.links[{i}].node", f"a nic fault needs node in 0..{topo.nodes - 1}"
                )
            if lf.nic is None or lf.nic >= topo.nics_per_node:
                raise fail(
                    f"faults.links[{i}].nic",
                    f"a nic fault needs nic in 0..{topo.nics_per_node - 1}",
                )
    if topo.nodes > 1 and topo.nics_per_node == 0:
        raise ConfigError(
            "a cluster of several nodes needs nics_per_node >= 1 (the nodes are disconnected)",
            file=topo_file or topo.name,
            field="nics_per_node",
        )
    _check_link_cuts(work, topo, file)
    return Resolved(n_gpus, tp, pp, dp, v, mbs, sl)


def _check_link_cuts(work: WorkloadConfig, topo: TopologyConfig, file: str) -> None:
    """Failed links (``bandwidth_factor: 0``) that cut a GPU or a node off the job.

    The job uses every GPU and every GPU talks to others, so a GPU whose NVLink port failed
    (in a node of several GPUs it reaches no peer of its node: intra-node traffic only goes
    over that port) or a node all of whose NICs in use failed (no route to other nodes; a
    failed NIC's GPUs otherwise reroute through another NIC of the node, see
    :mod:`simulator.network.topology`) cannot run the plan.
    """
    k, m = topo.gpus_per_node, topo.nics_per_node
    used_nics = {x * m // k for x in range(k)} if m else set()
    dead_nics: dict[int, list[int]] = {}
    for i, lf in enumerate(work.faults.links):
        if lf.bandwidth_factor > 0:
            continue
        if lf.kind == "nvlink" and k > 1:
            raise ConfigError(
                f"gpu {lf.gpu}'s NVLink port failed (bandwidth_factor 0), which cuts it off "
                f"from the other GPUs of node {lf.gpu // k} (accepted: bandwidth_factor > 0)",
                file=file,
                field=f"faults.links[{i}].bandwidth_factor",
            )
        if lf.kind == "nic" and topo.nodes > 1:
            dead_nics.setdefault(lf.node, []).append(i)
            failed = {work.faults.links[j].nic for j in dead_nics[lf.node]}
            if used_nics <= failed:
                raise ConfigError(
                    f"every NIC of node {lf.node} in use ({', '.join(map(str, sorted(used_nics)))}"
                    ") has failed, which cuts the node off the others (accepted: at least one "
                    "working NIC per node)",
                    file=file,
                    field=f"faults.links[{i}].bandwidth_factor",
                )
