"""Max-min fair sharing: textbook cases, the fluid model, and the SimPy flow network."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from simulator.config.schema import TopologyConfig
from simulator.network.flows import FlowNetwork, fluid_completion, maxmin_rates
from simulator.network.topology import Topology


def test_two_flows_on_one_link_get_half_each():
    assert maxmin_rates([[0], [0]], np.array([10.0])).tolist() == [5.0, 5.0]


def test_flow_bottlenecked_elsewhere_leaves_the_rest():
    # flow 0 crosses links 0 (cap 1) and 1 (cap 10); flow 1 only link 1
    r = maxmin_rates([[0, 1], [1]], np.array([1.0, 10.0]))
    assert r.tolist() == pytest.approx([1.0, 9.0])


def test_bertsekas_gallager_linear_network():
    # Data Networks sec. 6.5.2: a long flow across two links, one short flow on each link.
    r = maxmin_rates([[0, 1], [0], [1]], np.array([1.0, 1.0]))
    assert r.tolist() == pytest.approx([0.5, 0.5, 0.5])
    r = maxmin_rates([[0, 1], [0], [1]], np.array([1.0, 2.0]))
    assert r.tolist() == pytest.approx([0.5, 0.5, 1.5])
    # three levels: link 0 (cap 3) shared by 3 flows, one of which is held to 0.5 by link 1
    r = maxmin_rates([[0], [0], [0, 1], [2]], np.array([3.0, 0.5, 7.0]))
    assert r.tolist() == pytest.approx([1.25, 1.25, 0.5, 7.0])


def test_no_links_is_infinite_and_dead_link_is_zero():
    r = maxmin_rates([[], [0], [1]], np.array([0.0, 4.0]))
    assert r[0] == np.inf and r[1] == 0.0 and r[2] == 4.0


def test_maxmin_characterisation_on_random_networks():
    """Feasible, and every flow has a saturated link on which no flow gets more (max-min)."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        n_links, n_flows = 12, 40
        cap = rng.uniform(1, 10, n_links)
        flows = [
            sorted(rng.choice(n_links, rng.integers(1, 4), replace=False)) for _ in range(n_flows)
        ]
        r = maxmin_rates(flows, cap)
        load = np.zeros(n_links)
        for f, x in zip(flows, r, strict=True):
            load[f] += x
        assert (load <= cap * (1 + 1e-9)).all()
        for f, x in zip(flows, r, strict=True):
            ok = False
            for link in f:
                on = [r[j] for j, g in enumerate(flows) if link in g]
                if load[link] >= cap[link] * (1 - 1e-9) and x >= max(on) * (1 - 1e-9):
                    ok = True
            assert ok


def test_fluid_completion_reshares_when_a_flow_ends():
    # sizes 1 and 3 on one link of capacity 1: both at 0.5 until t=2, then the second alone
    t = fluid_completion([([0], 1.0), ([0], 3.0)], np.array([1.0]))
    assert t.tolist() == pytest.approx([2.0, 4.0])
    t = fluid_completion([([0], 0.0), ([], 5.0), ([1], 2.0)], np.array([1.0, 0.0]))
    assert t[0] == 0.0 and t[1] == 0.0 and t[2] == np.inf


def small_topology() -> Topology:
    cfg = TopologyConfig(
        name="t",
        gpu="x",
        nodes=2,
        gpus_per_node=2,
        nics_per_node=1,
        nvlink_bandwidth_GBps=100.0,
        nic_bandwidth_Gbps=80.0,
    )
    return Topology(cfg, SimpleNamespace(name="x", nvlink_GBps=100.0))


def test_flow_network_staggered_transfers():
    topo = small_topology()
    env = simpy.Environment()
    net = FlowNetwork(env, topo, efficiency=1.0)
    B = 100e9  # NVLink per direction
    done = {}

    def a():
        yield net.transfer([(0, 1, 2 * B)])  # alone for 1 s, then shares gpu1's down link
        done["a"] = env.now

    def b():
        yield env.timeout(1.0)
        yield net.transfer([(1, 1, 5.0), (0, 1, 0.5 * B)])  # a self-transfer costs nothing
        done["b"] = env.now

    env.process(a())
    env.process(b())
    env.run()
    # t=1: a has B left; both at B/2: b finishes at t=2, a has B/2 left, alone: t=2.5
    assert done["b"] == pytest.approx(2.0)
    assert done["a"] == pytest.approx(2.5)
    up0, down1 = topo.route(0, 1)
    assert net.link_bytes[up0] == pytest.approx(2.5 * B)
    assert net.link_busy_s[down1] == pytest.approx(2.5)
    assert net.active == 0


def test_flow_network_matches_fluid_completion():
    topo = small_topology()
    cap = topo.effective_capacity()
    transfers = [(0, 2, 3e9), (1, 2, 1e9), (1, 3, 2e9), (3, 0, 5e8)]
    expect = fluid_completion([(topo.route(s, d), b) for s, d, b in transfers], cap).max()
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    env.process((lambda: (yield net.transfer(transfers)))())
    env.run()
    assert env.now == pytest.approx(expect, rel=1e-9)


def _run_bounded(env: simpy.Environment, max_steps: int) -> int:
    """Step ``env`` until it runs dry; the number of steps (fails past ``max_steps``)."""
    steps = 0
    while env.peek() != float("inf"):
        env.step()
        steps += 1
        assert steps <= max_steps, f"still running at t={env.now} after {steps} events"
    return steps


def _late_transfers(t0: float) -> dict[int, float]:
    """Four staggered transfers sharing links, started at ``t0``: their end times - t0."""
    topo = small_topology()
    env = simpy.Environment(initial_time=t0)
    net = FlowNetwork(env, topo, efficiency=1.0)
    sizes = [2.54461888e8, 1.72845352e8 + 20.6755742, 3.3e8 / 7, 1e8 / 3]
    done = {}

    def go(i, src, dst, nbytes):
        yield env.timeout(i * 1.1e-4)
        yield net.transfer([(src, dst, nbytes)])
        done[i] = env.now

    for i, (s, d) in enumerate([(0, 1), (2, 1), (3, 1), (0, 2)]):
        env.process(go(i, s, d, sizes[i]))
    _run_bounded(env, 1000)
    assert len(done) == 4 and net.active == 0
    return {i: t - t0 for i, t in done.items()}


@pytest.mark.parametrize("t0", [5.75e6, 4e9])
def test_flow_network_finishes_far_into_a_run(t0):
    """Late in a long simulated run the clock's resolution (float64 spacing ~1e-9 s at 5e6 s)
    is coarser than the time a flow's last bytes need: the flows must still finish, and take
    the time they take at t = 0 (to the clock's resolution), instead of re-arming a
    zero-length timer forever."""
    early, late = _late_transfers(0.0), _late_transfers(t0)
    for i in early:
        assert late[i] == pytest.approx(early[i], abs=64 * np.spacing(t0))


def test_stuck_network_is_an_internal_error_naming_the_transfers(monkeypatch):
    """A clock that stops advancing with transfers in progress raises (no endless loop)."""
    import simulator.network.flows as flows

    topo = small_topology()
    env = simpy.Environment()
    net = FlowNetwork(env, topo, efficiency=1.0)
    # Sabotage progress: flows never move forward, so every timer re-arms at the same instant.
    monkeypatch.setattr(net, "_advance", lambda: None)
    monkeypatch.setattr(flows, "_MAX_STALLED_RESHARES", 50)
    env.process((lambda: (yield net.transfer([(0, 1, 1e9)])))())
    with pytest.raises(flows.StuckNetworkError, match=r"stopped advancing .* 1 transfer"):
        _run_bounded(env, 10_000)
