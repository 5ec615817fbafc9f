"""Shared test set-up: every test gets its own workspace; real-service tests skip locally
and fail under CI=true (where .ci/run has installed and started the services)."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch):
    """A fresh $TRAINOPS_HOME per test, so tests never share state."""
    home = tmp_path / "trainops-home"
    monkeypatch.setenv("TRAINOPS_HOME", str(home))
    return home


def _require(available: bool, why: str) -> None:
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"real service missing under CI=true: {why}")
    pytest.skip(why)


@pytest.fixture
def require_service():
    """`require_service(available, why)`: skip a real-service test where the service is absent,
    saying why; under CI=true that is a failure, because .ci/run starts every service."""
    return _require
