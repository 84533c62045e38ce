"""The embedded cluster: current client first (a loopback-only LocalCluster otherwise, reused:
``tests/system/test_embedded_cluster.py``)."""

from __future__ import annotations

import dkmeans


def test_current_client_is_used(client):
    assert dkmeans.get_client() is client
