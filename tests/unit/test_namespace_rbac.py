"""The RoleBinding a virtual node makes in each lower namespace it makes
(--lower-namespace-role): to whom and to what, as a table."""

from __future__ import annotations

import pytest

from vnode.providers.k2k.namespacerbac import BINDING_NAME, role_binding, subject_of


@pytest.mark.parametrize(
    ("username", "subject"),
    [
        (
            "system:serviceaccount:tensile-system:tensile-virtual-node-a",
            {"kind": "ServiceAccount", "name": "tensile-virtual-node-a",
             "namespace": "tensile-system"},
        ),
        (
            "vnode-a",  # a client certificate's CN
            {"kind": "User", "name": "vnode-a", "apiGroup": "rbac.authorization.k8s.io"},
        ),
        (
            "system:serviceaccount:no-name",  # not a ServiceAccount's full name
            {"kind": "User", "name": "system:serviceaccount:no-name",
             "apiGroup": "rbac.authorization.k8s.io"},
        ),
    ],
)  # fmt: skip
def test_the_binding_names_the_node_s_own_identity(username: str, subject: dict[str, str]) -> None:
    assert subject_of(username) == subject
    binding = role_binding(namespace="a-app", role="tensile-virtual-node-lower-namespaced",
                           username=username)  # fmt: skip
    assert binding["metadata"] == {"name": BINDING_NAME, "namespace": "a-app"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "tensile-virtual-node-lower-namespaced",
    }
    assert binding["subjects"] == [subject]
