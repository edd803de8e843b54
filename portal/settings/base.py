"""The core Django settings: environment, hosts, apps, templates, auth, languages, static files, sessions,
security headers and logging."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from portal.settings.env import env_bool, env_int, env_list, env_log_level, env_required, env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent

PORTAL_ENV = env_str("PORTAL_ENV", "development")
if PORTAL_ENV not in {"development", "test", "production"}:
    raise ImproperlyConfigured(f"PORTAL_ENV must be development, test or production, not {PORTAL_ENV!r}.")
PRODUCTION = PORTAL_ENV == "production"

# Where the embedded default keeps its database, kubesim's kubeconfig and console recordings.
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / "var")))

if PRODUCTION:
    SECRET_KEY = env_required("SECRET_KEY")
    DEBUG = env_bool("DEBUG", False)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS is required when PORTAL_ENV=production.")
    env_required("DATABASE_URL")
    env_required("REDIS_URL")
else:
    SECRET_KEY = env_str("SECRET_KEY", "embedded-default-not-secret-" + "x" * 40)
    DEBUG = env_bool("DEBUG", PORTAL_ENV == "development")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

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
    "portal.login_throttle.LoginThrottleMiddleware",
]

ROOT_URLCONF = "ops.urls"
ASGI_APPLICATION = "ops.asgi.application"
WSGI_APPLICATION = "portal.wsgi.application"

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
AUTHENTICATION_BACKENDS = ["portal.auth_backends.TenantModelBackend", "django.contrib.auth.backends.ModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("ja", _("Japanese"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The default clock: a tenant with a time zone of its own (Tenant.time_zone) is shown in that (portal.timezones).
TIME_ZONE = env_str("TIME_ZONE", "UTC")
# Date-and-time formats that end with the zone's abbreviation and write times as the browser's Intl does.
FORMAT_MODULE_PATH = ["portal.formats"]
USE_I18N = True
USE_TZ = True

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
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# Absolute session lifetime (a school day plus margin); logging out ends the session on the server.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)
CSRF_COOKIE_HTTPONLY = False  # the lab page's script reads it to send CSRF headers with fetch()
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
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
