"""Which folded communication must run in the flow network, because it can share links.

Folded mode prices a program collective (TP, CP) or a pipeline send *statically*: its cost on
the real groups' links with all the concurrent copies the process stands for sharing them.
That is exact as long as no other traffic uses those links while it runs. Data-parallel and
ZeRO collectives always run in the max-min fair flow network; a static collective that shares
a link with them, or with another process's static traffic, would miss the contention that
full detail sees (a TP group spanning nodes beside ZeRO-3 gathers on the same NICs, pipeline
sends beside gradient buckets on an oversubscribed leaf).

From the links each traffic source uses, :func:`contention_modes` decides per process:

* program collectives: ``"never"`` (their links carry nothing else: static, coalesced),
  ``"with_dp"`` (they share links only with their own stage's DP/ZeRO collectives: in the
  network while one of those is issued and not finished) or ``"always"`` (they share links
  with another stage's traffic, another process's collectives or pipeline sends: in the
  network also while any DP/ZeRO collective runs; the engine, ``Engine._in_network``);
* pipeline sends: in the network always where their links carry program collectives, and
  while any DP/ZeRO collective runs where they carry DP/ZeRO traffic. Sends of different
  stage pairs sharing a link stay static (a known approximation: sends are small and
  spread over the step).

In the network a collective runs as the bundles of all its concurrent copies
(:meth:`~simulator.network.collectives.CollectiveModel.bundles`), which alone take exactly
the static cost, so the choice changes the answer only where links are shared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping


def contention_modes(
    program_links: Mapping[int, Iterable[int]],
    stage_of: Mapping[int, int],
    send_links: Mapping[Hashable, Iterable[int]],
    dp_links: Mapping[int, Iterable[int]],
) -> tuple[dict[int, str], dict]:
    """``(mode per pid, mode per send key: "always" or "with_dp"; absent: never)``.

    ``program_links``: links of each process's program collectives (pid -> link ids);
    ``stage_of``: each process's pipeline stage; ``send_links``: links of each send (any key
    -> link ids); ``dp_links``: links of each stage's DP/ZeRO collectives."""
    users: dict[int, set] = defaultdict(set)
    for pid, links in program_links.items():
        for link in links:
            users[link].add(("prog", pid))
    for key, links in send_links.items():
        for link in links:
            users[link].add(("send", key))
    for stage, links in dp_links.items():
        for link in links:
            users[link].add(("dp", stage))
    modes: dict[int, str] = {}
    for pid, links in program_links.items():
        own_dp = ("dp", stage_of[pid])
        mode = "never"
        for link in links:
            others = users[link] - {("prog", pid)}
            if others - {own_dp}:
                mode = "always"
                break
            if others:
                mode = "with_dp"
        modes[pid] = mode
    sends: dict = {}
    for key, links in send_links.items():
        others = set().union(*(users[link] for link in links)) - {("send", key)}
        if any(kind == "prog" for kind, _ in others):
            sends[key] = "always"
        elif any(kind == "dp" for kind, _ in others):
            sends[key] = "with_dp"
    return modes, sends
