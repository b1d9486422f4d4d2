"""Checks that must hold after any engine run, whatever the test did to it."""

from __future__ import annotations

from django.apps import apps

from orchestration.models import ACTIVE_TURN_STATUSES, AgentDispatch, DispatchState


def assert_ended_turns_closed() -> None:
    """A turn that ended, in any way, has closed every dispatch (DESIGN.md §4)."""
    open_ = AgentDispatch.objects.exclude(turn__status__in=ACTIVE_TURN_STATUSES).exclude(state=DispatchState.CLOSED)
    assert not open_.exists(), [(d.agent_id, d.state, d.turn.status) for d in open_.select_related("turn")]


def references(targets: dict) -> dict[str, int]:
    """Rows of any installed model (auto-created ones too: m2m tables) whose foreign key
    points at one of `targets`' rows, counted per model and field."""
    found = {}
    for model in apps.get_models(include_auto_created=True):
        for field in model._meta.concrete_fields:
            if field.is_relation and field.related_model in targets and targets[field.related_model]:
                count = model._base_manager.filter(**{f"{field.attname}__in": targets[field.related_model]}).count()
                if count:
                    found[f"{model._meta.label}.{field.name}"] = count
    return found
