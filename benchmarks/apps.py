from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    """Tools that measure the engine (`manage.py bench`, `manage.py loadtest`): beside
    the engine, not in it. The scripted model server they use is the tests' (tests/support/)."""

    name = "benchmarks"
