"""Django settings, read from the environment (see README "Configuration").

Every default is the embedded one: SQLite under var/, the in-memory channel layer, the
offline LLM provider. Nothing here needs a service or a key to start.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from assistant.databases import channel_layers_from_url, channel_prefix, database_from_url
from assistant.env import env_bool, env_float, env_int, env_json_object, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("ASSISTANT_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "django_q",
    "template_partials",
    "axes",
    "assistant",
    "orchestration",
    "skills",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "assistant.middleware.TimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "assistant.middleware.StyledNotFoundMiddleware",
    "assistant.middleware.ContentSecurityPolicyMiddleware",
    # last, as django-axes asks: it turns a refused login into the lockout page
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "assistant.urls"
ASGI_APPLICATION = "assistant.asgi.application"
WSGI_APPLICATION = "assistant.wsgi.application"

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
            ],
        },
    }
]

DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL"), default_sqlite_path=VAR_DIR / "assistant.sqlite3",
        prepared_statements=env_bool("DB_PREPARED_STATEMENTS", True),
    )
}
# A new PostgreSQL connection forks a server backend (~4 ms): nothing should open one per
# task, per poll of the queue or per socket push. A qcluster's processes (workers, pusher,
# monitor) are plain synchronous processes, forked by django-q2: each keeps its own
# connection. Every other process (daphne above all, where Django advises against
# persistent connections) borrows from psycopg's connection pool.
RUNNING_QCLUSTER = sys.argv[1:2] == ["qcluster"]
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if RUNNING_QCLUSTER:
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 300)
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "pool": {"min_size": 1, "max_size": env_int("DB_POOL_MAX_SIZE", 20, minimum=1), "timeout": 10},
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
# Names in Redis are apart for each database (CHANNELS_PREFIX to choose them).
CHANNEL_LAYERS = channel_layers_from_url(
    REDIS_URL, prefix=channel_prefix(DATABASES["default"], chosen=env_str("CHANNELS_PREFIX")))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "conversation_list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request otherwise
# daphne serves no static files itself; WhiteNoise does, straight from the app folders.
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Mail: the console by default; EMAIL_BACKEND / EMAIL_HOST etc. switch to SMTP or files.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
# The SMTP connection's socket timeout: a hung mail server ends the call by itself, well
# before the skill's deadline has to interrupt its thread (skills/timeouts.py).
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 20.0, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "assistant@localhost")

# Security headers; the strict ones switch on with DEBUG off (`check --deploy` clean).
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # A year: browsers then refuse plain HTTP to this host (and its subdomains) for that
    # long, so only once HTTPS works everywhere. Preloading is a promise that is slow to
    # take back: only on request.
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

# --- Rate limits, login throttling, proxy trust (issue 18) ---------------------------------
# Behind a reverse proxy that terminates TLS, Django sees plain HTTP from the proxy. Only
# when the operator says one is there (TRUSTED_PROXY=1) are its X-Forwarded-Proto and
# X-Forwarded-For believed: without a proxy a client could send them itself, pass for
# HTTPS and pick any IP address to dodge the login throttle.
TRUSTED_PROXY = env_bool("TRUSTED_PROXY", False)
if TRUSTED_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# HSTS preloading is opted into (SECURE_HSTS_PRELOAD=1), not nagged about by `check --deploy`.
SILENCED_SYSTEM_CHECKS = [] if DEBUG or SECURE_HSTS_PRELOAD else ["security.W021"]

# Requests per user in a sliding window (assistant/ratelimits.py): past it, HTTP 429 with
# Retry-After. Counted when the request succeeds, so refused or invalid posts cost nothing.
ASSISTANT_RATE_LIMITS = {
    "conversation": env_int("RATE_CONVERSATIONS_PER_HOUR", 60, minimum=1),
    "message": env_int("RATE_MESSAGES_PER_HOUR", 120, minimum=1),
}
ASSISTANT_RATE_WINDOW_SECONDS = env_int("RATE_WINDOW_SECONDS", 3600, minimum=1)

# Login and admin login (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one
# username from one IP address, that username is refused from that address, even with the
# right password, for LOGIN_COOLOFF_SECONDS; after LOGIN_ADDRESS_FAILURE_LIMIT wrong
# passwords from one address for any usernames, the whole address is. Each attempt
# meanwhile starts the cool-off again. Not per username alone: anyone could then lock a
# known user out from anywhere; and the address's limit is well above a user's, or the
# people behind one office address would lock each other out (assistant/logins.py).
AXES_ENABLED = env_bool("LOGIN_THROTTLE", True)
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_ADDRESS_FAILURE_LIMIT = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 50, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("LOGIN_COOLOFF_SECONDS", 900, minimum=1))
AXES_HANDLER = "assistant.logins.LoginThrottle"  # the two limits above
# In this order: LoginThrottle reads the per-username count first, the per-address one second.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
# A success does not wipe the failures: it would let an attacker with an account of their
# own reset their address's count between guesses at someone else's.
AXES_RESET_ON_SUCCESS = False
AXES_LOCKOUT_CALLABLE = "assistant.logins.lockout_response"  # the 429 page, with Retry-After
AXES_CLIENT_IP_CALLABLE = "assistant.logins.client_ip"  # X-Forwarded-For only from a trusted proxy
# Failures are what throttle; a row per successful login would grow without end.
AXES_DISABLE_ACCESS_LOG = True
# The axes backend refuses a locked-out login before any password is checked; it is first,
# and has get_user (it is a ModelBackend) for sessions that name the first backend.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesBackend", "django.contrib.auth.backends.ModelBackend"]
# --- end of issue 18's rate limits ------------------------------------------------------------

# Background work: django-q2 always on its ORM broker (DESIGN.md §4: at-least-once
# delivery; the engine's leases and idempotency keys make a second delivery harmless).
# `timeout` must stay below `retry`, or a slow task is handed out twice while it runs.
# A worker process does not wait on the model: its runner (orchestration/delivery/runner.py) has up
# to ASSISTANT_AGENTS_IN_FLIGHT / Q_WORKERS agents and orchestrator steps in flight at once,
# each awaiting its model call. So Q_WORKERS bounds CPU work: about one per core.
Q_WORKERS = env_int("Q_WORKERS", 2, minimum=1)
ASSISTANT_AGENTS_IN_FLIGHT = env_int("ASSISTANT_AGENTS_IN_FLIGHT", 200, minimum=1)  # per qcluster
# Each runner's threads for database and skill work, each with its own connection: the
# connections a worker process holds, however many agents it has in flight.
# The engine's bookkeeping (claims, heartbeats, storing answers) has threads of its own,
# apart from skills: a slow or hung skill never delays another agent's step.
ASSISTANT_RUNNER_DB_THREADS = env_int("ASSISTANT_RUNNER_DB_THREADS", 4, minimum=1)
ASSISTANT_RUNNER_SKILL_THREADS = env_int("ASSISTANT_RUNNER_SKILL_THREADS", 6, minimum=1)
# A worker process that ends (recycled, or the cluster stopping) lets its agents finish for
# this long; then each goes back to the queue once its model call in flight is answered
# (a call with its retries at most, then it is cut short): nothing waits out a lease.
ASSISTANT_RUNNER_DRAIN_SECONDS = env_float("ASSISTANT_RUNNER_DRAIN_SECONDS", 10.0, minimum=0)
# A step that meets a transient database error (the server restarting, a lost connection,
# a deadlock) tries again on a fresh connection for this long before leaving the work to
# its lease (orchestration/delivery/dbretry.py).
ASSISTANT_DB_RETRY_SECONDS = env_float("ASSISTANT_DB_RETRY_SECONDS", 60.0, minimum=0)
Q_TIMEOUT = env_int("Q_TIMEOUT", 600, minimum=1)
Q_CLUSTER = {
    "name": "assistant",
    "orm": "default",
    # the ORM broker, woken by LISTEN/NOTIFY on PostgreSQL (orchestration/delivery/broker.py)
    "broker_class": "orchestration.delivery.broker.NotifyingORM",
    "workers": Q_WORKERS,
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT + 60,
    "max_attempts": 1,
    # A worker process is replaced after this many tasks; its runner drains first.
    "recycle": env_int("Q_RECYCLE", 500, minimum=1),
    "poll": env_float("Q_POLL_SECONDS", 0.05, minimum=0.01),
    "catch_up": False,
    "ack_failures": True,
    # Successful tasks are not stored: every step is in the engine's own tables (the audit
    # trail). With a positive limit, each save locked and read every stored success to
    # prune one: up to 1000 rows per task, serialised across workers.
    "save_limit": -1,
    "label": "Background tasks",
    "sync": env_bool("Q_SYNC", False),
}
if Q_CLUSTER["timeout"] >= Q_CLUSTER["retry"]:
    raise ImproperlyConfigured("Q_CLUSTER timeout must stay below retry.")

# LLM: the openai SDK reads OPENAI_API_KEY / OPENAI_BASE_URL itself. Without a key the
# offline provider plans deterministically and says so in its answers.
ASSISTANT_LLM_PROVIDER = env_str(
    "ASSISTANT_LLM_PROVIDER", "openai" if env_str("OPENAI_API_KEY") else "offline"
)
if ASSISTANT_LLM_PROVIDER not in {"openai", "offline"}:
    raise ImproperlyConfigured("ASSISTANT_LLM_PROVIDER must be 'openai' or 'offline'.")
ASSISTANT_ORCHESTRATOR_MODEL = env_str("ASSISTANT_ORCHESTRATOR_MODEL", "gpt-4o-mini")
ASSISTANT_AGENT_MODEL = env_str("ASSISTANT_AGENT_MODEL", "gpt-4o-mini")
ASSISTANT_LLM_TIMEOUT_SECONDS = env_float("ASSISTANT_LLM_TIMEOUT_SECONDS", 60.0, minimum=1)
ASSISTANT_LLM_MAX_RETRIES = env_int("ASSISTANT_LLM_MAX_RETRIES", 2)
# When a call still fails after the SDK's retries, the engine waits this long before its
# own first retry (LIMIT_*_MAX_RETRIES of them), doubling each time (orchestration/engine/retries.py).
ASSISTANT_LLM_RETRY_BACKOFF_SECONDS = env_float("ASSISTANT_LLM_RETRY_BACKOFF_SECONDS", 1.0, minimum=0)
# The orchestrator's calls stream (Chat Completions stream=true), so its answer shows in
# the chat as it is written; a server that cannot stream gets plain calls instead.
ASSISTANT_LLM_STREAM = env_bool("ASSISTANT_LLM_STREAM", True)
# Provider rate limits, shared by every worker (orchestration/llm/capacity/): requests and
# tokens per minute per model, '{"gpt-4o-mini": {"rpm": 500, "tpm": 200000}, "*": {...}}'
# (a "*" entry for every other model; "burst_seconds": how much may go at once, 1 by
# default). On OpenAI's own endpoint its first tier's limits are the defaults; a model with
# no limit is unlimited until the provider's x-ratelimit-* headers say otherwise. A 429
# holds every worker's calls to that model until its Retry-After. `manage.py check`
# refuses a malformed table (orchestration.E002).
ASSISTANT_PROVIDER_LIMITS = env_json_object("ASSISTANT_PROVIDER_LIMITS", {})
# Calls in flight at once per endpoint (base URL and key), for servers that serve a fixed
# number (vLLM, llama.cpp); 0: no cap.
ASSISTANT_PROVIDER_CONCURRENCY = env_int("ASSISTANT_PROVIDER_CONCURRENCY", 0)
# 0: no limiter at all (each call retries its 429s on its own, as before issue 26).
ASSISTANT_PROVIDER_LIMITER = env_bool("ASSISTANT_PROVIDER_LIMITER", True)
# How often, at most, the streamed answer so far is stored and pushed to the page.
ASSISTANT_STREAM_INTERVAL_SECONDS = env_float("ASSISTANT_STREAM_INTERVAL_SECONDS", 0.25, minimum=0)
# What each model call costs (orchestration/budgets/pricing.py): US dollars per million tokens,
# per model. `cached_input` prices the prompt tokens the provider served from its cache
# (they are part of the prompt tokens; without it they cost `input`). A dated snapshot
# (gpt-4o-mini-2024-07-18) takes its model's price. ASSISTANT_MODEL_PRICES, a JSON object
# of the same shape, adds models or replaces these entries: '{"my-model": {"input": 0.2,
# "output": 0.8}}'. A model without a price shows no cost: never a guess, and a total
# that mixes priced and unpriced calls says "at least" and names them.
DEFAULT_MODEL_PRICES = {
    "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.60},
    "gpt-4o": {"input": 2.50, "cached_input": 1.25, "output": 10.00},
    "gpt-4.1": {"input": 2.00, "cached_input": 0.50, "output": 8.00},
    "gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10, "output": 1.60},
    "gpt-4.1-nano": {"input": 0.10, "cached_input": 0.025, "output": 0.40},
}
ASSISTANT_MODEL_PRICES = {**DEFAULT_MODEL_PRICES, **env_json_object("ASSISTANT_MODEL_PRICES", {})}

# Limits (DESIGN.md §5). orchestration/budgets/limits.py is the one place that reads them.
ASSISTANT_LIMITS = {
    "skill_timeout_seconds": env_float("LIMIT_SKILL_TIMEOUT_SECONDS", 30.0, minimum=0.01),
    "agent_max_tool_calls": env_int("LIMIT_AGENT_MAX_TOOL_CALLS", 5, minimum=1),
    "agent_max_tool_calls_cap": env_int("LIMIT_AGENT_MAX_TOOL_CALLS_CAP", 20, minimum=1),
    "agent_token_budget": env_int("LIMIT_AGENT_TOKEN_BUDGET", 60_000, minimum=1),
    "agent_timeout_seconds": env_float("LIMIT_AGENT_TIMEOUT_SECONDS", 300.0, minimum=1),
    "agent_max_retries": env_int("LIMIT_AGENT_MAX_RETRIES", 1),
    "orchestrator_max_retries": env_int("LIMIT_ORCHESTRATOR_MAX_RETRIES", 2),
    "turn_max_agents": env_int("LIMIT_TURN_MAX_AGENTS", 8, minimum=1),
    "turn_max_skill_calls": env_int("LIMIT_TURN_MAX_SKILL_CALLS", 30, minimum=1),
    "turn_max_llm_iterations": env_int("LIMIT_TURN_MAX_LLM_ITERATIONS", 6, minimum=1),
    "conversation_max_skill_calls": env_int("LIMIT_CONVERSATION_MAX_SKILL_CALLS", 50, minimum=1),
    "conversation_window_seconds": env_int("LIMIT_CONVERSATION_WINDOW_SECONDS", 300, minimum=1),
    "max_delegation_depth": env_int("LIMIT_MAX_DELEGATION_DEPTH", 2),
    # Spend caps (issue 18): the sub-agents' model calls per turn, and the Continues one
    # turn may have (past them only Stop is left).
    "turn_max_llm_calls": env_int("LIMIT_TURN_MAX_LLM_CALLS", 200, minimum=1),
    "turn_max_continues": env_int("LIMIT_TURN_MAX_CONTINUES", 5),
}

# Spend caps (issue 18; orchestration/budgets/spending.py). Each user's allowance of model use per
# day and per calendar month of their time zone, in tokens (prompt + completion) and in US
# dollars for models with a price (ASSISTANT_MODEL_PRICES). 0 means no cap. These are the
# site defaults; staff set a user's own in the admin ("Users' spending"). Every model call
# reserves its estimate first (its prompt's characters / SPEND_CHARS_PER_TOKEN plus an
# allowance for the answer) and settles to what the provider reports after. While a cap is
# in force the answer's allowance is also the request's max_tokens: at most
# SPEND_COMPLETION_RESERVE_TOKENS (so it bounds answers: 4096 tokens is some 3,000 words)
# and at most what the cap leaves; below SPEND_MIN_COMPLETION_TOKENS the cap trips instead.
ASSISTANT_SPEND = {
    "tokens_per_day": env_int("SPEND_TOKENS_PER_DAY", 0),
    "tokens_per_month": env_int("SPEND_TOKENS_PER_MONTH", 0),
    "usd_per_day": env_float("SPEND_USD_PER_DAY", 0.0),
    "usd_per_month": env_float("SPEND_USD_PER_MONTH", 0.0),
    "completion_reserve_tokens": env_int("SPEND_COMPLETION_RESERVE_TOKENS", 4096, minimum=1),
    "min_completion_tokens": env_int("SPEND_MIN_COMPLETION_TOKENS", 256, minimum=1),
    "chars_per_token": env_int("SPEND_CHARS_PER_TOKEN", 3, minimum=1),
}

# Engine durability (DESIGN.md §4).
# A lease is renewed between steps, so it must outlast the longest step: an LLM call with
# its retries (timeout × (retries + 1)) or a skill call. `manage.py check` warns otherwise.
ASSISTANT_LEASE_SECONDS = env_int("ASSISTANT_LEASE_SECONDS", 300, minimum=5)
ASSISTANT_MAX_STEP_ATTEMPTS = env_int("ASSISTANT_MAX_STEP_ATTEMPTS", 3, minimum=1)

# Skills (DESIGN.md §7).
SKILLS_WORKSPACE_ROOT = Path(env_str("SKILLS_WORKSPACE_ROOT", str(VAR_DIR / "workspaces")))
# What skills did outside the database for calls not yet committed (skills/journal.py).
SKILLS_JOURNAL_ROOT = Path(env_str("SKILLS_JOURNAL_ROOT", str(VAR_DIR / "journal")))
SKILLS_MAX_FILE_BYTES = env_int("SKILLS_MAX_FILE_BYTES", 1_000_000, minimum=1)
SKILLS_MAX_ARGUMENT_BYTES = env_int("SKILLS_MAX_ARGUMENT_BYTES", 64_000, minimum=1)
SKILLS_BREAKER_THRESHOLD = env_int("SKILLS_BREAKER_THRESHOLD", 5, minimum=1)
SKILLS_BREAKER_COOLDOWN_SECONDS = env_float("SKILLS_BREAKER_COOLDOWN_SECONDS", 30.0)
SKILLS_EXECUTION_MODEL = "orchestration.SkillExecution"

# OpenTelemetry (orchestration/reports/otel.py): each turn as one trace, sent run by run,
# when the standard OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set (and OTEL_TRACES_EXPORTER is
# not "none"); message content only with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT.
# The GenAI client metrics (token usage, operation duration) likewise, with _METRICS_.
ASSISTANT_OTEL_TRACES = bool(env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env_str("OTEL_EXPORTER_OTLP_ENDPOINT")) \
    and env_str("OTEL_TRACES_EXPORTER", "otlp").lower() != "none"
ASSISTANT_OTEL_METRICS = bool(env_str("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env_str("OTEL_EXPORTER_OTLP_ENDPOINT")) \
    and env_str("OTEL_METRICS_EXPORTER", "otlp").lower() != "none"

# MCP servers (skills/mcp/): besides those staff add in the admin, a deployment may list
# them in a JSON file (a list of {"name", "command"/"args" or "url", "env", "headers",
# "timeout_seconds", "trust_read_only", "write_policy", "everyone", "users", "groups"}).
ASSISTANT_MCP_SERVERS_FILE = env_str("ASSISTANT_MCP_SERVERS_FILE", "")
ASSISTANT_MCP_SERVERS = (json.loads(Path(ASSISTANT_MCP_SERVERS_FILE).read_text()) if ASSISTANT_MCP_SERVERS_FILE
                         else [])
ASSISTANT_MCP_CONFIG_SECONDS = env_float("ASSISTANT_MCP_CONFIG_SECONDS", 10.0)  # servers read again after
ASSISTANT_MCP_TOOLS_SECONDS = env_float("ASSISTANT_MCP_TOOLS_SECONDS", 300.0)  # a tool list kept (or until changed)
ASSISTANT_MCP_CONNECT_SECONDS = env_float("ASSISTANT_MCP_CONNECT_SECONDS", 10.0, minimum=0.1)
ASSISTANT_MCP_RETRY_SECONDS = env_float("ASSISTANT_MCP_RETRY_SECONDS", 15.0)  # a server down is tried again after

# Skill guard (issue 18): no tenant can disable a skill for others, and caps per user.
# Circuit breakers count only outages (skills/breaker.py): a user's own circuit opens after
# SKILLS_BREAKER_THRESHOLD of them in a row; the skill's circuit for everyone only when,
# besides, SKILLS_BREAKER_USERS distinct users had failures within the window.
SKILLS_BREAKER_USERS = env_int("SKILLS_BREAKER_USERS", 3, minimum=1)
SKILLS_BREAKER_WINDOW_SECONDS = env_float("SKILLS_BREAKER_WINDOW_SECONDS", 600.0, minimum=1.0)
# Rows a user may hold per domain (skills/quotas.py), counted with the owner's row locked.
SKILLS_MAX_ROWS = {
    "tasks": env_int("SKILLS_MAX_TASKS", 10_000, minimum=0),
    "calendar": env_int("SKILLS_MAX_CALENDAR_EVENTS", 10_000, minimum=0),
    "memory": env_int("SKILLS_MAX_MEMORIES", 10_000, minimum=0),
    "email": env_int("SKILLS_MAX_OUTBOX_EMAILS", 10_000, minimum=0),
}
# A user's workspace: files and folders in it, and the bytes of its files together.
SKILLS_WORKSPACE_MAX_ENTRIES = env_int("SKILLS_WORKSPACE_MAX_ENTRIES", 1_000, minimum=1)
SKILLS_WORKSPACE_MAX_BYTES = env_int("SKILLS_WORKSPACE_MAX_BYTES", 50_000_000, minimum=1)

# Approvals (skills/policy.py, orchestration/questions/approvals.py). Each skill's policy when its
# owner set none: "allow", "ask" (pause the turn and show the call before it runs) or
# "deny". A skill that sends (Skill.recipients) asks unless listed; any other allows.
# ASSISTANT_SKILL_POLICIES, a JSON object in the environment, adds to or replaces entries.
SKILLS_DEFAULT_POLICIES = {"email.send": "ask"}
ASSISTANT_SKILL_POLICIES = {**SKILLS_DEFAULT_POLICIES, **env_json_object("ASSISTANT_SKILL_POLICIES", {})}
# Egress (skills/egress.py): a message to an address that is not at the owner's own
# domain, not a contact (sent to before) and not on their allow list asks first; and a
# day's messages and recipients per user are capped. Webmail domains are nobody's own.
ASSISTANT_EGRESS = {
    "ask_new_recipients": env_bool("EGRESS_ASK_NEW_RECIPIENTS", True),
    "daily_messages": env_int("EGRESS_DAILY_MESSAGES", 50, minimum=0),
    "daily_recipients": env_int("EGRESS_DAILY_RECIPIENTS", 100, minimum=0),
    "shared_domains": ["gmail.com", "googlemail.com", "outlook.com", "hotmail.com", "live.com", "yahoo.com",
                       "icloud.com", "proton.me", "protonmail.com", "aol.com", "gmx.com", "mail.com"],
}
# How long "always allow" on an approval prompt lasts.
ASSISTANT_APPROVAL_RULE_DAYS = env_int("ASSISTANT_APPROVAL_RULE_DAYS", 30, minimum=1)

# Retention and deletion (orchestration/reports/retention.py). `manage.py prune` removes the
# transcripts of turns finished longer ago than this (its --older-than overrides it),
# this many turns per transaction, leaving a tombstone with their counts, tokens and cost.
ASSISTANT_RETENTION_DAYS = env_int("ASSISTANT_RETENTION_DAYS", 90, minimum=1)
ASSISTANT_PRUNE_BATCH_SIZE = env_int("ASSISTANT_PRUNE_BATCH_SIZE", 200, minimum=1)

# Cheap sockets and bounded output (issue 18; README "Sockets and output size").
# Live sockets one daphne process accepts per user and per conversation; one more is
# closed with 4429 (assistant/watch.py). Each process counts its own sockets.
ASSISTANT_SOCKETS_PER_USER = env_int("ASSISTANT_SOCKETS_PER_USER", 30, minimum=1)
ASSISTANT_SOCKETS_PER_CONVERSATION = env_int("ASSISTANT_SOCKETS_PER_CONVERSATION", 10, minimum=1)
# How often a conversation's one poller reads the event log: often without Redis (it is
# how workers' events reach the page), rarely with it (a safety net under the group
# messages). Unset: 0.25 s without Redis, 5 s with it.
ASSISTANT_SOCKET_POLL_SECONDS = env_float("ASSISTANT_SOCKET_POLL_SECONDS", 0.25 if not REDIS_URL else 5.0,
                                          minimum=0.01)
# A socket pushes at most once per this interval: the first event of a quiet spell goes
# out at once, a burst after it in one read and render at the interval's end.
ASSISTANT_PUSH_INTERVAL_SECONDS = env_float("ASSISTANT_PUSH_INTERVAL_SECONDS", 0.1, minimum=0.0)
# The busy panels (counters, agent graph, waterfall) a socket sends at most once per this
# interval while events keep coming (assistant/live.py BUSY_PANELS).
ASSISTANT_PANEL_INTERVAL_SECONDS = env_float("ASSISTANT_PANEL_INTERVAL_SECONDS", 1.0, minimum=0.0)
# The share of a core a web process spends on them at most (assistant/pooled.py `Paced`):
# past it, each page's busy panels come less often; 1 is no limit.
ASSISTANT_PANEL_CPU_SHARE = env_float("ASSISTANT_PANEL_CPU_SHARE", 0.1, minimum=0.01, maximum=1.0)
# The threads a web process renders its sockets' pushes on (assistant/pooled.py): rendering
# is Python, so more threads only take turns at the GIL and slow the event loop.
ASSISTANT_PUSH_THREADS = env_int("ASSISTANT_PUSH_THREADS", 2, minimum=1)
# Sizes in characters (orchestration/records/output.py): the answer stored as the chat message (the
# model's whole response stays in the turn's stored LLM call, for the audit), any text run
# through markdown for a page (keep it at least answer_chars), and each value of an
# event's payload table (at least SKILLS_MAX_ARGUMENT_BYTES: an approval prompt shows a
# call's arguments whole). Past the cap a text ends with "…(truncated, N characters)".
ASSISTANT_OUTPUT_LIMITS = {
    "answer_chars": env_int("ASSISTANT_MAX_ANSWER_CHARS", 100_000, minimum=100),
    "rendered_chars": env_int("ASSISTANT_MAX_RENDERED_CHARS", 100_000, minimum=100),
    "payload_value_chars": env_int("ASSISTANT_MAX_PAYLOAD_VALUE_CHARS", 64_000, minimum=100),
}
if ASSISTANT_OUTPUT_LIMITS["rendered_chars"] < ASSISTANT_OUTPUT_LIMITS["answer_chars"]:
    raise ImproperlyConfigured("ASSISTANT_MAX_RENDERED_CHARS must be at least ASSISTANT_MAX_ANSWER_CHARS, "
                               "or a stored answer's own truncation note would be cut off.")
# Each process keeps the HTML of the markdown it rendered (keyed by the text's hash and
# the renderer's version), up to this many characters of HTML in all, so a page view does
# not run markdown and nh3 again over an answer already shown.
ASSISTANT_RENDERED_CACHE_CHARS = env_int("ASSISTANT_RENDERED_CACHE_CHARS", 20_000_000, minimum=0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django-q": {"level": env_str("Q_LOG_LEVEL", "WARNING")},
        # httpx logs every model request at INFO: a line per call is noise and CPU.
        "httpx": {"level": env_str("HTTPX_LOG_LEVEL", "WARNING")},
        # django-axes logs every successful login at INFO; failures and lockouts are warnings.
        "axes": {"level": env_str("AXES_LOG_LEVEL", "WARNING")},
    },
}
