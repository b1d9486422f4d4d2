from django import template
from django.utils.safestring import mark_safe

from assistant.rendering import render_markdown

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """Sanitised HTML from the model's markdown (see assistant/rendering.py)."""
    # bandit B308/B703 (mark_safe): the HTML is nh3's output from an allow-list of tags,
    # attributes and URL schemes, tested in tests/web/test_rendering.py.
    return mark_safe(render_markdown(text))  # noqa: S308  # nosec
