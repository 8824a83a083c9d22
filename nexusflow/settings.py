"""NexusFlow settings.

Databases come from two URLs (ARCHITECTURE.md section 7):

- ``NEXUS_DB_URL``: the main database (default
  ``mysql://nexus:nexus@127.0.0.1:3306/nexusflow``);
- ``NEXUS_CONTROL_DB_URL``: the ``control`` alias holding the cutover decision
  journal and restore receipts (default: same server, database
  ``nexusflow_control``).

Both use InnoDB, READ COMMITTED, ``utf8mb4`` and the ``mysqlclient`` driver.
"""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("NEXUS_SECRET_KEY", "nexusflow-local-development-only")
DEBUG = os.environ.get("NEXUS_DEBUG", "0") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver",
                 *[h.strip() for h in os.environ.get("NEXUS_ALLOWED_HOSTS", "").split(",") if h.strip()]]

# Production behind a TLS-terminating proxy (README "Production settings"): NEXUS_HTTPS=1 redirects plain HTTP,
# marks the session and CSRF cookies secure and sends HSTS; the proxy says the original scheme in
# X-Forwarded-Proto. `manage.py check --deploy --fail-level WARNING` passes with these and a NEXUS_SECRET_KEY.
if os.environ.get("NEXUS_HTTPS", "0") == "1":
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("NEXUS_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = os.environ.get("NEXUS_HSTS_INCLUDE_SUBDOMAINS", "1") == "1"
    SECURE_HSTS_PRELOAD = os.environ.get("NEXUS_HSTS_PRELOAD", "1") == "1"
    # The health check answers the proxy over plain HTTP on the loopback.
    SECURE_REDIRECT_EXEMPT = [r"^api/v2/health/$"]

DEFAULT_DB_URL = "mysql://nexus:nexus@127.0.0.1:3306/nexusflow"


def _database(url: str, *, test_name: str | None = None) -> dict:
    config = dj_database_url.parse(url, conn_max_age=0)
    if config["ENGINE"] == "django.db.backends.mysql":
        # Django's backend with transactions opened by START TRANSACTION (nexusflow/kernel/mysql/base.py).
        config["ENGINE"] = "nexusflow.kernel.mysql"
    config["OPTIONS"] = {
        "charset": "utf8mb4",
        "isolation_level": "read committed",
        "init_command": "SET sql_mode='STRICT_TRANS_TABLES', innodb_lock_wait_timeout=20",
    }
    config["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    if test_name:
        config["TEST"]["NAME"] = test_name
    return config


def _control_url(main_url: str) -> str:
    head, _, _name = main_url.rpartition("/")
    return f"{head}/{_name.split('?')[0]}_control"


_main_url = os.environ.get("NEXUS_DB_URL", DEFAULT_DB_URL)
_control = os.environ.get("NEXUS_CONTROL_DB_URL", _control_url(_main_url))
DATABASES = {
    "default": _database(_main_url),
    "control": _database(_control),
}
DATABASE_ROUTERS = ["nexusflow.routers.ControlDatabaseRouter"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "nexusflow.kernel",
    "nexusflow.records",
    "nexusflow.flows",
    "connectors",
    "runtime_outbox",
    "cutover",
    "packs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "nexusflow.kernel.logs.TraceMiddleware",
]

ROOT_URLCONF = "nexusflow.urls"
WSGI_APPLICATION = "nexusflow.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
#: Where ``manage.py collectstatic`` gathers every app's assets (admin, API docs) and where the web process
#: (WhiteNoise, right after SecurityMiddleware) serves them from; ``var/`` is not versioned.
STATIC_ROOT = Path(os.environ.get("NEXUS_STATIC_ROOT", BASE_DIR / "var" / "static"))
#: Compressed copies (gzip) are written at collectstatic; no manifest, so rendering a page never needs one.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

#: Closed by default: a view answers only operators (active staff, ``nexusflow.kernel.permissions``) unless it
#: opens itself with ``permission_classes = [AllowAny]`` and a comment saying why (tests/test_url_permissions.py
#: lists every URL). HTTP basic comes first so an anonymous request answers 401 with ``WWW-Authenticate``; an
#: authenticated user who is no operator answers 403.
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "nexusflow.records.tokens.OperatorTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["nexusflow.kernel.permissions.IsOperator"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "nexusflow.api_errors.exception_handler",
}
#: ``/api/docs/`` (Swagger UI) loads its assets from the local static files (sidecar package), never a CDN.
#: The schema and its page are public (they describe the API, they read no data).
SPECTACULAR_SETTINGS = {"TITLE": "NexusFlow API", "VERSION": "2.0.0", "SWAGGER_UI_DIST": "SIDECAR",
                        "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
                        "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
                        # A PATCH body is the view's whole input serializer (its required fields stay required).
                        "COMPONENT_SPLIT_PATCH": False,
                        # drf-spectacular's enum hook, then error headers and the links between operations
                        # (nexusflow.api_schema).
                        "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                                                 "nexusflow.api_schema.add_headers",
                                                 "nexusflow.api_schema.add_links"]}

# django-q2 runs the periodic schedules; NEXUS_Q_WORKERS and NEXUS_Q_SAVE_LIMIT size it (``make bench`` runs it as
# the peer with 1, 2 and 4 workers and keeps every task result to count them).
Q_CLUSTER = {"name": "nexusflow", "orm": "default", "workers": int(os.environ.get("NEXUS_Q_WORKERS", "1")),
             "timeout": 60, "retry": 120, "save_limit": int(os.environ.get("NEXUS_Q_SAVE_LIMIT", "250"))}

# Where L1 packs and tenant metadata live (ARCHITECTURE.md section 1).
# Lock-order reversals (nexusflow.kernel.locks): "raise" in tests and debug, "log" in production.
NEXUS_LOCK_ORDER = os.environ.get("NEXUS_LOCK_ORDER", "raise" if DEBUG else "log")


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{name} must be a positive integer, got {raw!r}")
    return value


#: Components materialized per admission transaction (seed 003 "Inbound facts").
NEXUS_ADMISSION_CHUNK = _positive_int("NEXUS_ADMISSION_CHUNK", 50)
# Who runs the periodic reconcilers (nexusflow/kernel/schedules.py): "workers" (run_workers loops, the default)
# or "schedules" (manage.py qcluster runs the schedules `manage.py schedules install` wrote; workers skip them).
NEXUS_RECONCILERS = os.environ.get("NEXUS_RECONCILERS", "workers")
if NEXUS_RECONCILERS not in ("workers", "schedules"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("NEXUS_RECONCILERS must be 'workers' or 'schedules'")
NEXUS_SCHEDULE_BATCH = _positive_int("NEXUS_SCHEDULE_BATCH", 100)
NEXUS_PACKS_DIR = Path(os.environ.get("NEXUS_PACKS_DIR", BASE_DIR / "packs"))
#: Versioned local secret backend: <dir>/<org>/<account>/<credential_ref>/<version>, one file per version.
NEXUS_SECRETS_DIR = Path(os.environ.get("NEXUS_SECRETS_DIR", BASE_DIR / "var" / "secrets"))
NEXUS_METADATA_DIR = Path(os.environ.get("NEXUS_METADATA_DIR", BASE_DIR / "metadata"))
#: Where `manage.py cutover restore-point` writes the dump files and manifest of each V1 restore point
#: (<dir>/<org>/<attempt>/<capture>/); keep it on storage that survives the loss of the database server.
NEXUS_BACKUP_DIR = Path(os.environ.get("NEXUS_BACKUP_DIR", BASE_DIR / "var" / "restore_points"))



def _log_format() -> str:
    """``NEXUS_LOG_FORMAT``: ``plain`` (default) or ``json`` (nexusflow/kernel/logs.py); anything else refuses to start."""
    value = os.environ.get("NEXUS_LOG_FORMAT", "") or "plain"
    if value not in ("plain", "json"):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"NEXUS_LOG_FORMAT must be plain or json, got {value!r}")
    return value


LOG_FORMAT = _log_format()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # NEXUS_LOG_FORMAT=json: one JSON object per line, correlation ids and safe codes only (nexusflow/kernel/logs.py).
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
                   "json": {"()": "nexusflow.kernel.logs.JsonFormatter"}},
    "filters": {"context": {"()": "nexusflow.kernel.logs.ContextFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["context"],
                             "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": os.environ.get("NEXUS_LOG_LEVEL", "WARNING")},
}
SILENCED_SYSTEM_CHECKS = ["models.W037"]  # django_q: MariaDB ignores conditional indexes
