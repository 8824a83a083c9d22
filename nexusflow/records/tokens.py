"""Operator API tokens: issue, revoke, authenticate (REST ``Authorization: Bearer <token>``).

A token is 32 random bytes, URL-safe base64, prefixed ``nft_``; only its SHA-256 is stored
(:class:`~nexusflow.records.models.OperatorToken`), so a database dump holds no usable token. It is shown
once, when issued. A token authenticates as its user while the user is an active staff operator and the
token has no :class:`~nexusflow.records.models.OperatorTokenRevocation`; what the operator may then do is
decided exactly as for a session or basic login (``org:<id>`` groups, the org's access policy).
"""
from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from rest_framework import authentication, exceptions

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert

from .models import OperatorToken, OperatorTokenRevocation

PREFIX = "nft_"


class TokenRefused(NexusError):
    """A token operation was refused (unknown user or token, already revoked, missing actor/reason)."""

    code = "operator_token_refused"
    definite = True


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def operator_token_issue(*, username: str, name: str, issued_by: str) -> tuple[OperatorToken, str]:
    """Issue a token for the operator ``username``; returns ``(row, token)`` (the token is never stored).

    Raises:
        TokenRefused: no such active staff user, or an empty ``name`` / ``issued_by``.
    """
    if not name.strip() or not issued_by.strip():
        raise TokenRefused("a token needs a name and who issued it")
    user = User.objects.filter(username=username, is_active=True, is_staff=True).first()
    if user is None:
        raise TokenRefused(f"{username!r} is not an active operator (staff user)")
    token = PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        row = insert(OperatorToken, user=user, name=name.strip()[:80], token_digest=token_digest(token),
                     issued_by=issued_by.strip()[:120], created_at=db_now())
    return row, token


def operator_token_revoke(*, token_id: int, revoked_by: str, reason: str) -> OperatorTokenRevocation:
    """End token ``token_id`` for good.

    Raises:
        TokenRefused: unknown token, already revoked, or an empty ``revoked_by`` / ``reason``.
    """
    if not revoked_by.strip() or not reason.strip():
        raise TokenRefused("a revocation needs who revoked it and why")
    token = OperatorToken.objects.filter(pk=token_id).first()
    if token is None:
        raise TokenRefused(f"no operator token {token_id}")
    try:
        with transaction.atomic():
            return insert(OperatorTokenRevocation, token=token, revoked_by=revoked_by.strip()[:120],
                          reason=reason.strip()[:240], created_at=db_now())
    except IntegrityError:
        raise TokenRefused(f"operator token {token_id} is already revoked") from None


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication by ``Authorization: Bearer nft_...`` (any other scheme is left to the others)."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Bearer needs exactly one token")
        try:
            token = header[1].decode("ascii")
        except UnicodeError:
            raise exceptions.AuthenticationFailed("the token is not ASCII") from None
        row = (OperatorToken.objects.select_related("user").filter(token_digest=token_digest(token))
               .filter(revocation__isnull=True).first())
        if row is None or not (row.user.is_active and row.user.is_staff):
            raise exceptions.AuthenticationFailed("unknown, revoked or inactive operator token")
        return row.user, row

    def authenticate_header(self, request) -> str:
        return self.keyword
