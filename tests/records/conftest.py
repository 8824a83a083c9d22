"""Fixtures of the record tests: a metadata view that adds a ``Team__c`` object tracking its field history."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nexusflow.records.metadata import current_view

TEAM = {"object": "Team__c", "label": "Team", "key_prefix": "a1T", "track_history": ["Name", "Region__c"],
        "fields": [{"name": "Name", "type": "text", "max_length": 80},
                   {"name": "Region__c", "type": "text", "max_length": 40},
                   {"name": "Notes__c", "type": "text", "max_length": 200}]}


def project_objects_copy(settings, tmp_path: Path) -> Path:
    """Copy the project's object metadata to ``tmp_path/metadata/objects`` for a test to change; return that folder."""
    objects = tmp_path / "metadata" / "objects"
    objects.mkdir(parents=True)
    for path in (Path(settings.BASE_DIR) / "metadata" / "objects").glob("*.object.json"):
        shutil.copy(path, objects / path.name)
    return objects


@pytest.fixture
def history_view(settings, tmp_path):
    objects = project_objects_copy(settings, tmp_path)
    (objects / "Team__c.object.json").write_text(json.dumps(TEAM), encoding="utf-8")
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = tmp_path / "metadata"
    current_view.cache_clear()
    yield tmp_path / "metadata"
    current_view.cache_clear()
