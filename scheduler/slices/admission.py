"""The extender's question for quota'd namespaces (pure): may this pod go to this virtual node
within the slices its namespace holds there?"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler.slices.record import Record, format_record, show


def admit(
    *,
    record: Record | None,
    node: str,
    requests: Mapping[str, int],
    placed: Iterable[Mapping[str, int]],
) -> str | None:
    """Return None when a pod may go to virtual node `node`, else why not (one line, shown
    in the pod's FailedScheduling event).

    `record`: its namespace's slices (`record.record_of`; None: no record, the
    namespace is unconstrained); `requests`: the pod's requests (`record.Units`:
    millicores, bytes; `units(pod_requests(pod))`); `placed`: the requests of the
    namespace's pods already bound to `node` and not finished (one by one, or summed).
    The pod is admitted when, for every resource its slices bound, what is placed plus
    the pod stays within the slices' budget there.
    """
    if record is None:
        return None
    holding = record.get(node)
    if holding is None or holding.count <= 0:
        return (
            f"its namespace holds no quota slices on {node} (its slices: {format_record(record)})"
        )
    budget = holding.budget()
    used = dict.fromkeys(budget, 0)
    for pod in placed:
        for name in budget:
            used[name] += pod.get(name, 0)
    for name, amount in budget.items():
        wanted = requests.get(name, 0)
        if used[name] + wanted > amount:
            return (
                f"its namespace's quota slices on {node} ({holding.count}x{holding.size}) "
                f"allow {show(name, amount)} {name}: {show(name, used[name])} in use, "
                f"the pod requests {show(name, wanted)}"
            )
    return None
