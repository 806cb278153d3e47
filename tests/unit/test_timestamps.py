"""The one formatter of Kubernetes timestamps (`tensile.kube.timestamps`) and its users."""

from __future__ import annotations

import datetime as dt

from tensile.kube.timestamps import rfc3339
from vnode.api import certificates, stats


def test_rfc3339_is_utc_whole_seconds_with_z() -> None:
    moment = dt.datetime(2026, 3, 1, 12, 0, 0, 999_999, tzinfo=dt.UTC)
    assert rfc3339(moment) == "2026-03-01T12:00:00Z"  # the fraction is dropped
    paris = dt.timezone(dt.timedelta(hours=1))
    assert rfc3339(dt.datetime(2026, 3, 1, 13, 0, tzinfo=paris)) == "2026-03-01T12:00:00Z"


def test_every_layer_formats_through_it() -> None:
    moment = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
    csr = {"metadata": {}, "spec": {}, "status": {}}
    [condition] = certificates.approved(csr, node_name="vn", now=moment)["status"]["conditions"]
    assert condition["lastUpdateTime"] == rfc3339(moment)
    assert stats._time(moment.timestamp() + 0.9) == rfc3339(moment)
