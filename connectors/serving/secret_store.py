"""The local versioned secret backend (seed 003 "Existing foundations and schema ownership").

Secret bytes never enter the database. Each credential version is one file::

    NEXUS_SECRETS_DIR/<org_id>/<account_key>/<credential_ref>/<secret_version>

written once (mode 0600) and never rewritten: a new secret is a new version,
and a ``CredentialGeneration`` names exactly one version. Reads name the exact
version; there is no "latest" and no fallback to another version.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key


class SecretUnavailable(NexusError):
    """The exact secret version cannot be read (missing, unreadable, or empty)."""

    code = "credential_unavailable"


class SecretVersionConflict(NexusError):
    """A secret version already exists with other bytes: versions are write-once."""

    code = "secret_version_conflict"
    definite = True


def _segment(value: str, field: str) -> str:
    value = validate_key(value, field=field, max_length=80)
    if value in (".", "..") or "/" in value or "\\" in value:
        raise SecretVersionConflict(f"{field} {value!r} cannot name a directory entry", code="invalid_identity")
    return value


def secret_path(*, org_id: str, account_key: str, credential_ref: str, secret_version: str) -> Path:
    """Return the file of one exact secret version (it may not exist).

    Raises:
        InvalidIdentity: a non-canonical segment.
        SecretVersionConflict (code ``invalid_identity``): a segment that is a path
            separator or a dot entry.
    """
    root = Path(settings.NEXUS_SECRETS_DIR)
    return root.joinpath(_segment(org_id, "org_id"), _segment(account_key, "account_key"),
                         _segment(credential_ref, "credential_ref"), _segment(secret_version, "secret_version"))


def secret_exists(**ref: str) -> bool:
    """True when the exact version file exists; the secret bytes are not read."""
    return secret_path(**ref).is_file()


def secret_write_once(*, secret: bytes, **ref: str) -> bool:
    """Store ``secret`` as the exact version, once.

    Returns:
        True when the file was written, False when the same bytes were already there.

    Raises:
        SecretVersionConflict: the version exists with different bytes, or ``secret`` is empty.
    """
    if not secret:
        raise SecretVersionConflict("an empty secret cannot be published", code="secret_empty")
    path = secret_path(**ref)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.read_bytes() != secret:
            raise SecretVersionConflict(
                f"secret version {ref['secret_version']!r} of {ref['account_key']}/{ref['credential_ref']} "
                "already holds other bytes; publish a new version") from None
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(secret)
    return True


def secret_read(**ref: str) -> bytes:
    """Read the exact version's bytes at use time (never stored, never 'latest').

    Raises:
        SecretUnavailable: the file is missing, unreadable or empty (the message
            names the version, never the bytes).
    """
    path = secret_path(**ref)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SecretUnavailable(f"secret version {ref['secret_version']!r} of "
                                f"{ref['account_key']}/{ref['credential_ref']} is unavailable: {exc.strerror}") from None
    if not data:
        raise SecretUnavailable(f"secret version {ref['secret_version']!r} is empty")
    return data
