"""Server-generated names and the labels the sweep relies on."""

import pytest

from labs.kubevirt import names


def test_vm_and_secret_names_derive_from_the_attempt_id_only():
    assert names.vm_name(42) == "attempt-42"
    assert names.cloud_init_secret_name("attempt-42") == "attempt-42-cloudinit"
    assert names.attempt_id_from_vm_name("attempt-42") == 42


@pytest.mark.parametrize("bad", [0, -1, "42", True, None])
def test_vm_name_refuses_anything_but_a_positive_id(bad):
    with pytest.raises(ValueError):
        names.vm_name(bad)


@pytest.mark.parametrize("name", ["attempt-042", "attempt-", "my-vm", "attempt-4x", "attempt-42-cloudinit"])
def test_foreign_names_map_to_no_attempt(name):
    assert names.attempt_id_from_vm_name(name) is None


def test_labels_name_ids_and_the_manager():
    labels = names.attempt_labels(tenant_id=1, course_id=2, lab_id=3, attempt_id=4)
    assert labels == {
        "app.kubernetes.io/managed-by": "lab-portal",
        "labs.portal/tenant": "1",
        "labs.portal/course": "2",
        "labs.portal/lab": "3",
        "labs.portal/attempt": "4",
    }
    assert names.attempt_id_from_labels(labels) == 4
    assert names.MANAGED_SELECTOR == "app.kubernetes.io/managed-by=lab-portal"


@pytest.mark.parametrize(
    "labels",
    [
        None,
        {},
        {"labs.portal/attempt": "4"},
        {"app.kubernetes.io/managed-by": "someone-else", "labs.portal/attempt": "4"},
        {"app.kubernetes.io/managed-by": "lab-portal", "labs.portal/attempt": "x4"},
        {"app.kubernetes.io/managed-by": "lab-portal", "labs.portal/attempt": "04"},
    ],
)
def test_objects_without_our_label_or_a_clean_attempt_id_are_not_ours(labels):
    assert names.attempt_id_from_labels(labels) is None
