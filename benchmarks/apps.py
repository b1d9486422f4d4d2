from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    """Tools that measure the engine (`manage.py bench`, `manage.py loadtest`) and the
    scripted OpenAI-compatible server the tests share: beside the engine, not in it."""

    name = "benchmarks"
