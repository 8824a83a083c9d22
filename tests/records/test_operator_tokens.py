"""Operator API tokens: ``Authorization: Bearer <token>`` beside session and basic logins (issue 23 item 5).

Only a token's SHA-256 is stored; a revoked token, an unknown one and one of a user who is no longer an
active operator answer 401; what a token may do is what its operator may do.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection

from nexusflow.records.models import OperatorToken
from tests.conftest import run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _issue(login: str = "tok-op") -> str:
    done = run_manage(["operator_tokens", "issue", "--user", login, "--name", "ci scraper", "--by", "ops"],
                      subprocess_env())
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _get(client, token: str):
    return client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_token_authenticates_its_operator_until_revoked_and_only_its_digest_is_stored(client):
    user = User.objects.create_user("tok-op", password="pw", is_staff=True)
    token = _issue()
    assert token.startswith("nft_") and _get(client, token).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {OperatorToken._meta.db_table}")
        assert token not in repr(cursor.fetchall())  # the value is nowhere in the table
    assert _get(client, token[:-2] + "xx").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token} extra").status_code == 401
    [row] = OperatorToken.objects.all()
    revoked = run_manage(["operator_tokens", "revoke", str(row.pk), "--by", "ops", "--reason", "rotated"],
                         subprocess_env())
    assert revoked.returncode == 0, revoked.stderr
    refused = _get(client, token)
    assert refused.status_code == 401 and refused.json()["error"] == "authentication_failed"
    again = run_manage(["operator_tokens", "revoke", str(row.pk), "--by", "ops", "--reason", "twice"],
                       subprocess_env())
    assert again.returncode == 1 and "operator_token_refused" in again.stderr
    fresh = _issue()
    user.is_staff = False
    user.save()
    assert _get(client, fresh).status_code == 401  # no longer an operator


def test_a_token_is_issued_only_to_an_active_operator():
    User.objects.create_user("plain-user", password="pw", is_staff=False)
    refused = run_manage(["operator_tokens", "issue", "--user", "plain-user", "--name", "x", "--by", "ops"],
                         subprocess_env())
    assert refused.returncode == 1 and "operator_token_refused" in refused.stderr
    assert not OperatorToken.objects.exists()
