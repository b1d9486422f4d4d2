from django import template
from django.utils.safestring import mark_safe

from assistant.rendering import render_markdown

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """Sanitised HTML from the model's markdown (see assistant/rendering.py)."""
    return mark_safe(render_markdown(text))  # noqa: S308 - nh3 produced it
