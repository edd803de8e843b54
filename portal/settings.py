"""Settings for the lab portal, read from the environment once. With nothing set it runs embedded (SQLite,
in-memory channel layer and Celery, kubesim); ``PORTAL_ENV=production`` refuses to start without its secrets."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _
from kombu import Queue

from portal.redis_async import pool_options

T = TypeVar("T")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


# An unset or empty variable gives the default; a malformed one fails at start with a message naming it.
def env_required(name: str) -> str:
    if not (value := os.environ.get(name)):
        raise ImproperlyConfigured(f"The environment variable {name} is required when PORTAL_ENV=production.")
    return value


def _env_parsed(name: str, default: T, parse: Callable[[str], T], expected: str) -> T:
    if not (value := os.environ.get(name)):
        return default
    try:
        return parse(value)
    except (KeyError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name} must be {expected}, not {value!r}.") from exc


def env_bool(name: str, default: bool) -> bool:
    return _env_parsed(name, default, lambda value: _BOOLEANS[value.strip().lower()], "true or false")


def env_int(name: str, default: int) -> int:
    return _env_parsed(name, default, int, "an integer")


def env_log_level(name: str, default: str) -> str:
    expected = f"one of {', '.join(_LOG_LEVELS)}"
    return _env_parsed(name, default, lambda value: _LOG_LEVELS[_LOG_LEVELS.index(value.strip().upper())], expected)


def env_list(name: str, default: list[str]) -> list[str]:
    return _env_parsed(name, default, lambda value: [item.strip() for item in value.split(",") if item.strip()], "")


BASE_DIR = Path(__file__).resolve().parent.parent

PORTAL_ENV = os.environ.get("PORTAL_ENV") or "development"
if PORTAL_ENV not in {"development", "test", "production"}:
    raise ImproperlyConfigured(f"PORTAL_ENV must be development, test or production, not {PORTAL_ENV!r}.")
PRODUCTION = PORTAL_ENV == "production"

# Where the embedded default keeps its database, kubesim's kubeconfig and console recordings.
VAR_DIR = Path(os.environ.get("PORTAL_VAR_DIR") or str(BASE_DIR / "var"))

if PRODUCTION:
    SECRET_KEY = env_required("SECRET_KEY")
    DEBUG = env_bool("DEBUG", False)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS is required when PORTAL_ENV=production.")
    env_required("DATABASE_URL")
    env_required("REDIS_URL")
else:
    SECRET_KEY = os.environ.get("SECRET_KEY") or "embedded-default-not-secret-" + "x" * 40
    DEBUG = env_bool("DEBUG", PORTAL_ENV == "development")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
CSRF_FAILURE_VIEW = "portal.views.csrf_failure"

# Request bodies past these sizes (uploads, everything else) are refused with 413 before they are read.
REQUEST_BODY_MAX_BYTES = env_int("REQUEST_BODY_MAX_BYTES", 1024 * 1024)
REQUEST_UPLOAD_MAX_BYTES = env_int("REQUEST_UPLOAD_MAX_BYTES", 4 * 1024 * 1024)
# Django's own check on the bodies it reads into memory (forms, request.body) at the same size.
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_MAX_BYTES

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "portal",
    "labs",
    "grading",
    "api",
    "ops",
    "drf_spectacular_sidecar",
    "csp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "portal.timezones.TenantTimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "portal.ratelimit.LoginThrottleMiddleware",
]

ROOT_URLCONF = "ops.urls"
ASGI_APPLICATION = "ops.asgi.application"

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
                "django.template.context_processors.i18n",
            ],
        },
    },
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "portal.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if PORTAL_ENV == "test":
    # PBKDF2 costs about a second per persona on a shared CI core.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The session's user comes with its tenant; Django's own backend stays listed for the sessions it signed in.
AUTHENTICATION_BACKENDS = ["portal.http.TenantModelBackend", "django.contrib.auth.backends.ModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("ja", _("Japanese"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The default clock: a tenant with a time zone of its own (Tenant.time_zone) is shown in that (portal.timezones).
TIME_ZONE = os.environ.get("TIME_ZONE") or "UTC"
# Date-and-time formats that end with the zone's abbreviation and write times as the browser's Intl does.
FORMAT_MODULE_PATH = ["portal.formats"]

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = not PRODUCTION

# Sessions are read from the shared cache first, written through to the database to survive a cache restart.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
# Absolute session lifetime (a school day plus margin); logging out ends the session on the server.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)
# Django's defaults hold for the rest: HttpOnly session cookie (not the CSRF one, which the lab page's script
# sends with fetch()), SameSite=Lax, nosniff, a same-origin Referer, X-Frame-Options DENY; Celery speaks JSON.
if PRODUCTION:
    # __Host- cookies are only accepted over HTTPS, for this exact host, with Path=/ (no subdomain can set them).
    SESSION_COOKIE_NAME = "__Host-sessionid"
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # Kubernetes probes speak plain HTTP to the pod and count a redirect as success: answer them directly.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_log_level("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Django's own console handler (DEBUG only) would write each of its messages a second time beside the root's.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # Celery's line per task sent, received and succeeded would bury everything else (failures are ERROR).
        **{
            name: {"level": env_log_level("TASK_LOG_LEVEL", "WARNING")}
            for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
        },
    },
}

# Database: PostgreSQL through DATABASE_URL, otherwise SQLite under var/.
DATABASE_URL = os.environ.get("DATABASE_URL") or None
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # Server-side binding gives the same query text every time, which psycopg prepares after
        # DB_PREPARE_THRESHOLD runs on a connection that lives (set it to 0 behind PgBouncer in transaction mode).
        prepare_threshold = env_int("DB_PREPARE_THRESHOLD", 5)
        options = DATABASES["default"].setdefault("OPTIONS", {})
        options.update(server_side_binding=True, prepare_threshold=prepare_threshold if prepare_threshold > 0 else None)
        # daphne gives each request its own thread and connection: a pool per process makes a class's Starts wait
        # rather than exhaust PostgreSQL's max_connections (needs DB_CONN_MAX_AGE=0).
        if (pool_size := env_int("DB_POOL_MAX_SIZE", 0)) > 0:
            options["pool"] = {"min_size": 1, "max_size": pool_size, "timeout": env_int("DB_POOL_TIMEOUT", 30)}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # a fresh clone has no var/ yet, and SQLite will not create it
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "portal.sqlite3"),
            # WAL: readers and the web's, worker's and beat's writers no longer hold each other up.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"},
            # A file, not the in-memory database, whose shared cache fails at once on another thread's write lock.
            "TEST": {"NAME": str(VAR_DIR / "test_portal.sqlite3")},
        }
    }

# Redis: Celery broker and the channel layer in production and tests; in-memory in the embedded default.
REDIS_URL = os.environ.get("REDIS_URL") or None
# Without driver information redis-py skips CLIENT SETINFO (two round trips and a metadata read) on each new connection.
REDIS_CONNECTION_OPTIONS = {"driver_info": None}
# Every Redis key of the portal begins with this, so that several portals or test runs can share one database.
REDIS_KEY_PREFIX = os.environ.get("REDIS_KEY_PREFIX", "")
# Socket timeouts (above the worker's 1 s BRPOP): a broker that never answers must not hang a student's Start.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": 3600,
    "socket_timeout": 5,
    "socket_connect_timeout": 5,
}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's, with a receive that loses no message when its consumer leaves (portal.channel_layer).
            "BACKEND": "portal.channel_layer.RedisChannelLayer",
            # socket_timeout above channels_redis's 5 s BZPOPMIN (redis-py's 5 s default killed idle consumers); a
            # bounded pool makes a class's hundred group_add calls wait for a connection (portal.redis_async).
            "CONFIG": {
                "hosts": [
                    pool_options(
                        REDIS_URL,
                        socket_timeout=30,
                        max_connections=env_int("CHANNEL_LAYER_MAX_CONNECTIONS", 32),
                        **REDIS_CONNECTION_OPTIONS,
                    )
                ],
                "capacity": 1500,
                "expiry": 30,
                "prefix": f"{REDIS_KEY_PREFIX}asgi",
            },
        }
    }
    # django-redis keeps one connection pool per process (Django's own backend built one per request under ASGI).
    CACHES = {
        "default": {
            # django-redis's, whose clear() removes only this cache's keys, not the whole database (portal.redis_cache).
            "BACKEND": "portal.redis_cache.PrefixedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_KEY_PREFIX,
            "OPTIONS": {
                "SOCKET_CONNECT_TIMEOUT": 5,
                "SOCKET_TIMEOUT": 5,
                "CONNECTION_POOL_KWARGS": REDIS_CONNECTION_OPTIONS,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = REDIS_KEY_PREFIX
else:
    # Channels' own, forgetting ended consumers' channels (portal.channel_layer); a class overflowed 100 messages.
    CHANNEL_LAYERS = {"default": {"BACKEND": "portal.channel_layer.InMemoryChannelLayer", "CONFIG": {"capacity": 1500}}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "portal"}}
    CELERY_BROKER_URL = "memory://localhost/"  # with a host: kombu warns at start without one
    # The in-memory transport polls its queues; its default of 1 s would add up to a second to every start.
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.05
# True when tasks are consumed by a worker running inside the web process (the embedded default).
CELERY_EMBEDDED_WORKER = REDIS_URL is None

REST_FRAMEWORK = {
    # Token first: an anonymous API request is then answered 401 with a WWW-Authenticate challenge.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.JSONParserBoundedDepth",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "api.views.common.PortalPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lab portal API",
    "DESCRIPTION": "Courses, labs, attempts on KubeVirt VMs, grading runs and grades.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from the pinned sidecar package, served by whitenoise: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"AttemptStateEnum": "labs.models.AttemptState", "RunStateEnum": "grading.models.RunState"},
    "PATH_CONVERTER_OVERRIDES": {"id": {"type": "integer", "format": "int64", "minimum": 1, "maximum": 2**63 - 1}},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.schema.document_shared_refusals"],
    # Request bodies are documented as JSON, where null and nesting are what they are; forms are still parsed.
    "PARSER_WHITELIST": ["api.parsers.JSONParserBoundedDepth"],
}

# Rate limits (portal.ratelimit): scope -> (requests, window in seconds). Refusals are 429 with Retry-After.
RATE_LIMITS = {
    # lab starts per user
    "attempt_start": (env_int("RATE_LIMIT_STARTS", 10), env_int("RATE_LIMIT_STARTS_WINDOW_SECONDS", 600)),
    # Check presses per attempt (grading also enforces GRADING_MIN_INTERVAL_SECONDS between two runs)
    "attempt_check": (env_int("RATE_LIMIT_CHECKS", 30), env_int("RATE_LIMIT_CHECKS_WINDOW_SECONDS", 600)),
    # failed sign-ins (HTML form, admin and API token) per client address, whatever the accounts
    "login_address": (
        env_int("RATE_LIMIT_LOGIN_FAILURES_PER_ADDRESS", 50),
        env_int("RATE_LIMIT_LOGIN_WINDOW_SECONDS", 900),
    ),
}
# Past LOGIN_FAILURES_BEFORE_DELAY failed sign-ins per (account, address), each try waits LOGIN_DELAY_SECONDS,
# doubled with every failure, at most LOGIN_DELAY_MAX_SECONDS (portal.ratelimit).
LOGIN_FAILURES_BEFORE_DELAY = env_int("LOGIN_FAILURES_BEFORE_DELAY", 5)
LOGIN_DELAY_SECONDS = env_int("LOGIN_DELAY_SECONDS", 2)
LOGIN_DELAY_MAX_SECONDS = env_int("LOGIN_DELAY_MAX_SECONDS", 900)
# Behind a proxy, the META key carrying the client's address (e.g. HTTP_X_REAL_IP); REMOTE_ADDR otherwise.
RATE_LIMIT_CLIENT_ADDRESS_HEADER = os.environ.get("RATE_LIMIT_CLIENT_ADDRESS_HEADER") or "REMOTE_ADDR"

# ws:// and wss:// connect-src sources for ALLOWED_HOSTS, which 'self' does not cover in older browsers (any port
# outside production). CSP host sources cannot name IPv6 literals ([::1]): browsers reject the whole source.
_websocket_hosts = [
    f"*{host}" if host.startswith(".") else host
    for host in ALLOWED_HOSTS
    if host not in ("", "*") and not host.startswith("[")
]
_websocket_sources = (
    [f"wss://{host}" for host in _websocket_hosts]
    if PRODUCTION
    else [f"{scheme}://{host}:*" for host in _websocket_hosts for scheme in ("ws", "wss")]
)

# Content Security Policy (django-csp): no inline or third-party script anywhere. Styles allow 'unsafe-inline'
# because xterm.js 6 (static/vendor/xterm) injects <style> elements for its DOM renderer and scrollbar.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'", *_websocket_sources],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# Cluster access: in-cluster config, then KUBECONFIG, then the embedded kubesim's kubeconfig.
KUBECONFIG = os.environ.get("KUBECONFIG") or None
KUBE_CONTEXT = os.environ.get("KUBE_CONTEXT") or None
EMBEDDED_KUBECONFIG = VAR_DIR / "kubesim" / "kubeconfig"

# Attempt lifecycle timings (seconds unless named otherwise).
ATTEMPT_SYNC_INTERVAL_SECONDS = env_int("ATTEMPT_SYNC_INTERVAL_SECONDS", 3)
ATTEMPT_SWEEP_INTERVAL_SECONDS = env_int("ATTEMPT_SWEEP_INTERVAL_SECONDS", 60)
ATTEMPT_START_TIMEOUT_SECONDS = env_int("ATTEMPT_START_TIMEOUT_SECONDS", 600)
ATTEMPT_SLOW_START_NOTICE_SECONDS = env_int("ATTEMPT_SLOW_START_NOTICE_SECONDS", 90)
ATTEMPT_EXTEND_MINUTES = env_int("ATTEMPT_EXTEND_MINUTES", 15)
ATTEMPT_MAX_EXTENSIONS = env_int("ATTEMPT_MAX_EXTENSIONS", 2)
# Namespaces whose attempts are all steady (running) are listed this often; others on every sync.
ATTEMPT_RESYNC_SECONDS = env_int("ATTEMPT_RESYNC_SECONDS", 30)
# How long a VM may stay unable to pull its image (or be otherwise held) before the attempt fails with that reason.
ATTEMPT_FAILURE_GRACE_SECONDS = env_int("ATTEMPT_FAILURE_GRACE_SECONDS", 30)
# How long a VM may wait for a node with room (an autoscaler takes minutes); below ATTEMPT_START_TIMEOUT_SECONDS.
ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS = env_int("ATTEMPT_UNSCHEDULABLE_GRACE_SECONDS", 300)
# Starts in flight across the deployment before new ones are asked to retry (JupyterHub's concurrent_spawn_limit).
ATTEMPT_CONCURRENT_START_LIMIT = env_int("ATTEMPT_CONCURRENT_START_LIMIT", 100)
# After creating a VM its namespace is listed again at these delays, so a quick start is seen before the next sync.
ATTEMPT_FOLLOW_UP_SECONDS = (0.05, 0.3, 1.0, 2.5)
ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS = env_int("ATTEMPT_TASK_SOFT_TIME_LIMIT_SECONDS", 60)
KUBEVIRT_NAMESPACE = os.environ.get("KUBEVIRT_NAMESPACE") or "kubevirt"
# The portal's own namespace when it runs in the cluster (its pods may then reach the agent port too).
PORTAL_NAMESPACE = os.environ.get("PORTAL_NAMESPACE") or None
# Warm pools (labs.services.pools): a pass every POOL_PASS_SECONDS makes at most POOL_REFILL_PER_PASS VMs per pool.
POOL_PASS_SECONDS = env_int("POOL_PASS_SECONDS", 5)
POOL_REFILL_PER_PASS = env_int("POOL_REFILL_PER_PASS", 5)
# Booting pool VMs' agents are asked every pass, ready ones only this often (a claim asks the agent anyway).
POOL_READY_CHECK_SECONDS = env_int("POOL_READY_CHECK_SECONDS", 30)
# A pool's refill waits while its class is arriving (within POOL_REFILL_HOLD_SECONDS of its latest claim), for at
# most POOL_REFILL_HOLD_MAX_SECONDS after the first claim since its last refill. 0: no hold.
POOL_REFILL_HOLD_SECONDS = env_int("POOL_REFILL_HOLD_SECONDS", 5)
POOL_REFILL_HOLD_MAX_SECONDS = 6 * POOL_REFILL_HOLD_SECONDS
# Claimed and deleted pool VM rows are pruned this many days after they ended, their figures kept on the pool.
POOL_VM_RETENTION_DAYS = env_int("POOL_VM_RETENTION_DAYS", 30)
GRADING_MIN_INTERVAL_SECONDS = env_int("GRADING_MIN_INTERVAL_SECONDS", 10)
# A grading run no worker picked up within this long is failed (a regrade: at least twice the task time limit).
GRADING_QUEUED_STALE_SECONDS = 300
# How long one check's output pattern may take to match (labs.patterns); past it the check fails, saying why.
GRADING_PATTERN_TIMEOUT_MS = env_int("GRADING_PATTERN_TIMEOUT_MS", 1000)
AGENT_PORT = 8787

CONSOLE_SCROLLBACK_BYTES = env_int("CONSOLE_SCROLLBACK_BYTES", 64 * 1024)
# Output sent to a browser but not yet acknowledged as drawn; past it the viewer is lagging (labs.console.flow).
CONSOLE_OUTPUT_WINDOW_BYTES = 1024 * 1024
CONSOLE_LAG_CLOSE_SECONDS = 60.0
CONSOLE_INPUT_FRAME_MAX_BYTES = 16 * 1024
CONSOLE_INPUT_RATE_BYTES_PER_SECOND = 32 * 1024
CONSOLE_INPUT_BURST_BYTES = 64 * 1024
CONSOLE_LEASE_TTL_SECONDS = 6.0
CONSOLE_UPSTREAM_RETRY_SECONDS = 1.0
CONSOLE_UPSTREAM_MAX_BACKOFF_SECONDS = 5.0
CONSOLE_UPSTREAM_MAX_MESSAGE_BYTES = 1024 * 1024
CONSOLE_RECORDING_MAX_BYTES = 32 * 1024 * 1024
CONSOLE_RECORDING_FLUSH_SECONDS = 0.5
# Connections one process's consoles share: each command is one short round trip, so a few dozen carry hundreds.
CONSOLE_REDIS_MAX_CONNECTIONS = 64
CONSOLE_RECORDINGS_DIR = Path(os.environ.get("CONSOLE_RECORDINGS_DIR") or str(VAR_DIR / "recordings"))

# /metrics accepts `Authorization: Bearer $METRICS_TOKEN` when the token is set, and a staff session always.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN") or None
HEALTH_CLUSTER_TIMEOUT_SECONDS = env_int("HEALTH_CLUSTER_TIMEOUT_SECONDS", 2)
HEALTH_CLUSTER_CACHE_SECONDS = env_int("HEALTH_CLUSTER_CACHE_SECONDS", 5)
HEALTH_SYNC_MAX_AGE_SECONDS = env_int("HEALTH_SYNC_MAX_AGE_SECONDS", max(60, 10 * ATTEMPT_SYNC_INTERVAL_SECONDS))

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 300)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 240)
CELERY_TIMEZONE = TIME_ZONE

# The beat's passes, and a warm Start's claim finish, have queues of their own that every worker also consumes, so
# they run as soon as a process is free rather than behind a backlog of starts; a pass stays valid a few periods.
CELERY_TASK_QUEUES = [Queue("celery"), Queue("periodic"), Queue("claims")]
CELERY_TASK_ROUTES = {"labs.tasks.finish_pool_claim": {"queue": "claims"}}
CELERY_BEAT_SCHEDULE = {
    name: {
        "task": task,
        "schedule": float(seconds),
        "options": {"queue": "periodic", "expires": max(10.0, 3.0 * seconds)},
    }
    for name, task, seconds in (
        ("labs-sync-attempts", "labs.tasks.sync_attempts", ATTEMPT_SYNC_INTERVAL_SECONDS),
        ("labs-sweep-attempts", "labs.tasks.sweep_attempts", ATTEMPT_SWEEP_INTERVAL_SECONDS),
        ("labs-tend-pools", "labs.tasks.tend_pools", POOL_PASS_SECONDS),
        # Grading runs whose worker never came or died, so they stop showing as in progress.
        ("grading-sweep-runs", "grading.tasks.grading_runs_sweep", ATTEMPT_SWEEP_INTERVAL_SECONDS),
    )
}
