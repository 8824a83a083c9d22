"""``manage.py check --deploy`` passes with the production settings the README documents (issue 23 item 5)."""
import secrets

from tests.conftest import run_manage, subprocess_env

PRODUCTION = {"NEXUS_HTTPS": "1", "NEXUS_ALLOWED_HOSTS": "nexusflow.example.com", "NEXUS_DEBUG": "0"}


def test_check_deploy_passes_with_the_documented_production_settings():
    done = run_manage(["check", "--deploy", "--fail-level", "WARNING"],
                      subprocess_env(NEXUS_SECRET_KEY=secrets.token_urlsafe(50), **PRODUCTION), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout + done.stderr


def test_check_deploy_fails_without_them():
    """The check can fail: the laptop defaults (no HTTPS settings, the development key) are refused."""
    env = subprocess_env(NEXUS_HTTPS="0")
    env.pop("NEXUS_SECRET_KEY", None)
    done = run_manage(["check", "--deploy", "--fail-level", "WARNING"], env, timeout=120)
    assert done.returncode != 0
    assert "security.W008" in done.stderr and "security.W009" in done.stderr
