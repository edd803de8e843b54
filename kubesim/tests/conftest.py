"""Fixtures: a kubesim subprocess per test module, a kubernetes ApiClient for it, a fresh namespace per test."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from kubesim.testing import KubesimServer


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with KubesimServer(tmp_path_factory.mktemp("kubesim"), tls=True, bookmark_interval=0.5) as server:
        yield server


@pytest.fixture(scope="module")
def api(sim):
    api_client = sim.api_client()
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def custom(api):
    return client.CustomObjectsApi(api)


@pytest.fixture(scope="module")
def core(api):
    return client.CoreV1Api(api)


@pytest.fixture
def namespace(core, sim):
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    sim.admin.clear_faults()
    core.delete_namespace(name)
