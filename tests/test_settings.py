import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from assistant.databases import channel_layers_from_url, database_from_url
from assistant.env import env_bool, env_float, env_int
from tests.conftest import own_redis_database


def test_default_database_is_sqlite_under_var(tmp_path):
    config = database_from_url("", default_sqlite_path=tmp_path / "var" / "db.sqlite3")
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert Path(config["NAME"]) == tmp_path / "var" / "db.sqlite3"
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert (tmp_path / "var").is_dir()


def test_postgres_url_is_parsed(tmp_path):
    config = database_from_url(
        "postgres://bob:pw@db.internal:5433/assistant", default_sqlite_path=tmp_path / "x"
    )
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["HOST"], config["PORT"], config["NAME"], config["USER"]) == (
        "db.internal", 5433, "assistant", "bob",
    )


def test_postgres_binds_on_the_server_and_prepares_what_a_connection_repeats(tmp_path):
    options = database_from_url("postgres://db/assistant", default_sqlite_path=tmp_path / "x")["OPTIONS"]
    assert (options["server_side_binding"], options["prepare_threshold"]) == (True, 1)
    behind_an_old_pgbouncer = database_from_url("postgres://db/assistant", default_sqlite_path=tmp_path / "x",
                                                prepared_statements=False)["OPTIONS"]
    assert behind_an_old_pgbouncer["prepare_threshold"] is None


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared statements")
def test_a_statement_run_twice_on_a_connection_is_prepared_there():
    for _ in range(2):
        list(get_user_model().objects.filter(username="nobody-prepared"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        prepared = [statement for (statement,) in cursor.fetchall()]
    assert any("nobody-prepared" not in statement and '"auth_user"' in statement for statement in prepared), prepared


@pytest.mark.parametrize("url", ["mysql://root@localhost/x", "nonsense://"])
def test_unsupported_database_urls_are_refused(url, tmp_path):
    with pytest.raises(ImproperlyConfigured):
        database_from_url(url, default_sqlite_path=tmp_path / "x")


def test_redis_url_selects_channels_redis_pub_sub():
    layers = channel_layers_from_url("redis://127.0.0.1:6379/0")
    assert layers["default"]["BACKEND"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    [host] = layers["default"]["CONFIG"]["hosts"]
    assert host["address"] == "redis://127.0.0.1:6379/0"


def test_each_database_has_its_own_names_in_redis():
    """A deployment's web processes and workers share a database, so a prefix; deployments
    (and test runs) sharing a Redis do not (tests/web/test_channel_layer.py)."""
    from assistant.databases import channel_prefix

    ours = {"ENGINE": "django.db.backends.postgresql", "HOST": "db", "PORT": "5432", "NAME": "assistant"}
    assert channel_prefix(ours) == channel_prefix(dict(ours))
    assert len({channel_prefix(ours), channel_prefix({**ours, "NAME": "other"}),
                channel_prefix({**ours, "HOST": "db2"}), channel_prefix({**ours, "PORT": "5433"})}) == 4
    layers = channel_layers_from_url("redis://127.0.0.1:6379/0", prefix=channel_prefix(ours))
    assert layers["default"]["CONFIG"]["prefix"] == channel_prefix(ours)
    assert channel_prefix(ours, chosen="shop-2.eu_west") == "shop-2.eu_west"


@pytest.mark.parametrize("chosen", ["my shop", "shop:1", "é", "x" * 61])
def test_a_channels_prefix_channels_cannot_name_is_refused_at_start_up(chosen):
    from assistant.databases import channel_prefix

    with pytest.raises(ImproperlyConfigured, match="CHANNELS_PREFIX must be 1 to 60 ASCII letters"):
        channel_prefix({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}, chosen=chosen)


def test_each_test_process_has_its_own_redis_database():
    """A test that flushes Redis flushes its own process's database alone (tests/conftest.py)."""
    numbers = [own_redis_database("redis://127.0.0.1:6379/0", f"gw{i}") for i in range(3)]
    assert numbers == ["redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/3"]
    assert own_redis_database("redis://:pw@cache:6380", "gw14") == "redis://:pw@cache:6380/15"
    assert own_redis_database("redis://cache/0", "gw15") == "redis://cache/1"


def test_no_redis_url_selects_in_memory_layer():
    assert channel_layers_from_url("")["default"]["BACKEND"].endswith("InMemoryChannelLayer")


def test_env_helpers_fail_loudly(monkeypatch):
    monkeypatch.setenv("LIMIT_X", "lots")
    with pytest.raises(ImproperlyConfigured, match="LIMIT_X"):
        env_int("LIMIT_X", 3)
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        env_bool("FLAG")
    monkeypatch.setenv("LIMIT_X", "-1")
    with pytest.raises(ImproperlyConfigured, match="minimum"):
        env_int("LIMIT_X", 3, minimum=1)
    monkeypatch.setenv("SHARE", "2")  # e.g. ASSISTANT_PANEL_CPU_SHARE: a share of one core
    with pytest.raises(ImproperlyConfigured, match="maximum of 1"):
        env_float("SHARE", 0.1, maximum=1.0)
    monkeypatch.setenv("SHARE", "0.5")
    assert env_float("SHARE", 0.1, maximum=1.0) == 0.5


# What the tests' own environment may set that would change the settings under test.
UNSET = {"DEBUG", "SECRET_KEY", "TRUSTED_PROXY", "SECURE_HSTS_SECONDS", "SECURE_HSTS_PRELOAD"}


def run_settings(env: dict, code: str = "import assistant.settings as s; "
                 "print(s.SECRET_KEY[:3], s.ASSISTANT_LIMITS['turn_max_agents'])") -> subprocess.CompletedProcess:
    """assistant/settings.py loaded in a fresh interpreter under `env`, running `code`."""
    clean = {k: v for k, v in os.environ.items() if k not in UNSET}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=False)


def test_production_refuses_to_start_without_secret_key():
    result = run_settings({"DEBUG": "0"})
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_limits_come_from_the_environment():
    result = run_settings({"DEBUG": "0", "SECRET_KEY": "s3cret-value", "LIMIT_TURN_MAX_AGENTS": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["s3c", "3"]


def database_settings(argv: list[str], database_url: str) -> dict:
    code = ("import json, sys; sys.argv = %r; import assistant.settings as s; "
            "print(json.dumps(s.DATABASES['default'], default=str))" % argv)
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DATABASE_URL": database_url},
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_workers_keep_their_connection_and_web_processes_borrow_from_a_pool():
    """A new PostgreSQL connection per task, per queue poll or per socket push cost a
    server backend each (settings.py); qcluster's forked processes cannot share a pool."""
    url = "postgres://postgres@127.0.0.1:5432/assistant"
    worker = database_settings(["manage.py", "qcluster"], url)
    assert worker["CONN_MAX_AGE"] == 300 and "pool" not in worker.get("OPTIONS", {})
    web = database_settings(["daphne", "assistant.asgi:application"], url)
    assert web["CONN_MAX_AGE"] == 0 and web["OPTIONS"]["pool"]["max_size"] == 20
    assert web["CONN_HEALTH_CHECKS"] and worker["CONN_HEALTH_CHECKS"]
    embedded = database_settings(["daphne"], "sqlite:////tmp/x.sqlite3")
    assert "pool" not in embedded["OPTIONS"]  # SQLite: opening the file is cheap


def settings_values(env: dict, names: list[str]) -> dict:
    """`names` as assistant/settings.py sets them under `env` (None where it leaves one unset)."""
    result = run_settings(env, "import json; import assistant.settings as s; "
                               f"print(json.dumps({{n: getattr(s, n, None) for n in {names!r}}}, default=str))")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "s3cret-value"}
HSTS = ["SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER"]


def test_production_sends_hsts_for_a_year_and_trusts_no_proxy_unless_told():
    assert settings_values(PRODUCTION, HSTS) == {
        "SECURE_HSTS_SECONDS": 31_536_000, "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False, "SECURE_PROXY_SSL_HEADER": None}
    behind_proxy = settings_values({**PRODUCTION, "TRUSTED_PROXY": "1", "SECURE_HSTS_PRELOAD": "1"}, HSTS)
    assert behind_proxy["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert behind_proxy["SECURE_HSTS_PRELOAD"] is True


def test_development_sends_no_hsts():
    """HSTS on localhost would pin every other local project to HTTPS for a year."""
    assert settings_values({}, ["SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER"]) == {
        "SECURE_HSTS_SECONDS": None, "SECURE_PROXY_SSL_HEADER": None}


def test_rate_limits_and_the_login_throttle_come_from_the_environment():
    values = settings_values({"RATE_CONVERSATIONS_PER_HOUR": "7", "RATE_MESSAGES_PER_HOUR": "9",
                              "LOGIN_FAILURE_LIMIT": "3", "LOGIN_COOLOFF_SECONDS": "60", "LOGIN_THROTTLE": "0"},
                             ["ASSISTANT_RATE_LIMITS", "AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "AXES_ENABLED"])
    assert values == {"ASSISTANT_RATE_LIMITS": {"conversation": 7, "message": 9}, "AXES_FAILURE_LIMIT": 3,
                      "AXES_COOLOFF_TIME": "0:01:00", "AXES_ENABLED": False}
    assert settings_values({}, ["AXES_ENABLED"]) == {"AXES_ENABLED": True}
    for name, value in [("RATE_MESSAGES_PER_HOUR", "lots"), ("RATE_CONVERSATIONS_PER_HOUR", "0"),
                        ("LOGIN_FAILURE_LIMIT", "0")]:
        result = run_settings({name: value})
        assert result.returncode != 0 and name in result.stderr


@pytest.mark.parametrize("password, why", [
    ("4815162342108", "entirely numeric"),
    ("password1234", "too common"),
    ("short", "too short"),
])
def test_weak_passwords_are_refused(db, password, why):
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match=why):
        validate_password(password)


def test_production_settings_pass_the_deploy_checks():
    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "SECURE_HSTS_SECONDS"}}
    env.update(DEBUG="0", SECRET_KEY="x" * 60 + "-not-a-real-key-9f8e7d6c", ALLOWED_HOSTS="assistant.example.com")
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
