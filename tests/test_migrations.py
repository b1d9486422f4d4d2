from io import StringIO

from django.core.management import call_command


def test_migrations_are_up_to_date(db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
