"""Checkpoint field classes and the support projection that redacts sensitive context (seed 004 section 17.3).

Every value a Flow checkpoint holds is one of four classes:

- **control**: the executor's own state (cursor, step, loop positions, record identity and version);
- **business**: record field values and Flow variables (the default);
- **sensitive**: business values an operator must not read in a support view, declared per object and field in
  the metadata file ``field_classes.json`` (``{"sensitive": {<object>: [<field>, ...]}}``, beside
  ``objects/``); durable in the checkpoint, because the run needs them to resume;
- **forbidden**: credential material, refused before any checkpoint commits
  (:func:`nexusflow.flows.store.checkpoint_payload_check`, ``flow_checkpoint_credential``).

:func:`support_projection` is what every support read shows of checkpoint content (the FlowCheckpoint admin,
the run support read's wait outcomes): each value under a key that names a sensitive field, of any object
(a checkpoint may hold a record, a variable or a Get Records result, so the projection matches by field name,
which errs towards hiding), becomes ``{"redacted": "sensitive", "digest": <64 hex>}``; the digest (v2,
canonical JSON of the value) lets an operator compare two values without reading either. Logs and audit rows
carry codes and digests only (docs/operations.md "What is never stored").
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from django.conf import settings

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2

CLASSES = ("control", "business", "sensitive", "forbidden")
FIELD_CLASSES_FILE = "field_classes.json"
REDACTED = "sensitive"


@functools.cache
def _sensitive_fields(directory: str) -> frozenset[str]:
    path = Path(directory) / FIELD_CLASSES_FILE
    if not path.is_file():
        return frozenset()
    document = json.loads(path.read_text(encoding="utf-8"))
    sensitive = document.get("sensitive") or {}
    if not isinstance(sensitive, dict) or not all(isinstance(v, list) and all(isinstance(f, str) for f in v)
                                                  for v in sensitive.values()):
        raise ValueError(f"{path}: 'sensitive' maps each object to a list of field names")
    return frozenset(f for fields in sensitive.values() for f in fields)


def sensitive_fields() -> frozenset[str]:
    """Every field name the metadata declares sensitive (any object)."""
    return _sensitive_fields(str(settings.NEXUS_METADATA_DIR))


def redacted(value: Any) -> dict[str, str]:
    """The support view of one sensitive value: ``{"redacted": "sensitive", "digest": 64 hex}``."""
    return {"redacted": REDACTED, "digest": digest_v2("flows.redacted-value", [
        ("value", canonical_json.dumps(value))]).hexdigest}


def support_projection(payload: Any) -> Any:
    """``payload`` (checkpoint content) with every value of a sensitive field redacted, at any depth.

    Returns a new JSON value; ``payload`` is not changed.
    """
    hidden = sensitive_fields()
    if not hidden:
        return payload

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: redacted(value) if key in hidden and value is not None else walk(value)
                    for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(payload)
