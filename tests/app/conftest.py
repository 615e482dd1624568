"""Fixtures for the app tests: the fixture database, and the app pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from app_fixture_db import build, build_replayed


@pytest.fixture(scope="session")
def fixture_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('appdb') / 'gemmscape.db'}"
    build(url)
    return url


@pytest.fixture
def use_db(fixture_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("GEMMSCAPE_DB", fixture_db)
    yield fixture_db


@pytest.fixture(scope="session")
def replay_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('replaydb') / 'gemmscape.db'}"
    build_replayed(url)
    return url


@pytest.fixture
def use_replay_db(replay_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("GEMMSCAPE_DB", replay_db)
    yield replay_db
