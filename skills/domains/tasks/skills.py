"""tasks.*: search, create, update and complete the user's to-do items.

A task an agent writes carries the outside content that had reached it, and every
result that shows such a task names it as outside content (skills/provenance.py)."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.common import iso, owned, parse_date
from skills.provenance import provenance_data, provenance_stamp, rows_outside
from skills.quotas import rows_reserve
from skills.domains.tasks.models import NOTES_MAX, TITLE_MAX, Task

SEARCH_LIMIT_MAX = 50
_UNSET = object()


def task_search(
    user,
    *,
    text: str = "",
    status: str | None = None,
    overdue: bool | None = None,
    due_after: str | None = None,
    due_before: str | None = None,
    limit: int = 20,
) -> dict:
    today = timezone.localdate()
    tasks = Task.objects.filter(owner=user)
    if text:
        tasks = tasks.filter(Q(title__icontains=text) | Q(notes__icontains=text))
    if status:
        tasks = tasks.filter(status=status)
    late = Q(status=Task.Status.OPEN, due__lt=today)
    if overdue is True:
        tasks = tasks.filter(late)
    elif overdue is False:
        tasks = tasks.exclude(late)
    if due_after:
        tasks = tasks.filter(due__gte=parse_date(due_after, field="due_after"))
    if due_before:
        tasks = tasks.filter(due__lte=parse_date(due_before, field="due_before"))
    page = list(tasks[:limit])
    return {
        "tasks": [_data(task, today) for task in page],
        "total": len(page) if len(page) < limit else tasks.count(),  # counted only when the page is full
    }


def task_create(user, *, title: str, notes: str = "", due: str | None = None) -> dict:
    rows_reserve(user=user, domain="tasks")
    task = Task(owner=user, title=title, notes=notes, due=parse_date(due, field="due"))
    provenance_stamp(task)
    task.save()
    return {"task": _data(task)}


def task_update(user, *, task_id: int, title=_UNSET, notes=_UNSET, due=_UNSET) -> dict:
    if title is _UNSET and notes is _UNSET and due is _UNSET:
        raise SkillError("nothing to update: give at least one of title, notes, due")
    task = owned(Task, user=user, pk=task_id, noun="task")
    if title is not _UNSET:
        task.title = title
    if notes is not _UNSET:
        task.notes = notes
    if due is not _UNSET:
        task.due = parse_date(due, field="due")
    provenance_stamp(task)
    task.save()
    return {"task": _data(task)}


def task_complete(user, *, task_id: int) -> dict:
    task = owned(Task, user=user, pk=task_id, noun="task")
    already_done = task.status == Task.Status.DONE
    if not already_done:
        task.status = Task.Status.DONE
        task.completed_at = timezone.now()
        provenance_stamp(task)
        task.save(update_fields=["status", "completed_at", "provenance"])
    return {"task": _data(task), "already_done": already_done}


def _data(task: Task, today=None) -> dict:
    today = today or timezone.localdate()
    return {
        "id": task.pk,
        "title": task.title,
        "notes": task.notes,
        "status": task.status,
        "due": iso(task.due),
        "overdue": task.status == Task.Status.OPEN and task.due is not None and task.due < today,
        "created_at": iso(task.created_at),
        "completed_at": iso(task.completed_at),
        **provenance_data(task),
    }


def _outside(arguments: dict, result: dict) -> list[str]:
    """The tasks in a result that an agent wrote from outside content."""
    return rows_outside("task", result, "task", "tasks")


_TITLE = schema.text("Short title.", max_length=TITLE_MAX, min_length=1, one_line=True)
_NOTES = schema.text("Free-form notes.", max_length=NOTES_MAX)

DOMAIN = Domain(
    name="tasks",
    description="The user's to-do list: find, add, change and complete tasks.",
    skills=(
        Skill(
            name="tasks.search",
            description="Find the user's tasks, due date first. Returns at most `limit` "
            "tasks and the total number that matched.",
            parameters=schema.params(
                {
                    "text": schema.text("Words in the title or notes.", max_length=200),
                    "status": schema.choice("Only tasks in this state.", ["open", "done"]),
                    "overdue": schema.boolean(
                        "true: only open tasks past their due date; false: none of them."
                    ),
                    "due_after": schema.date("Due on or after this day"),
                    "due_before": schema.date("Due on or before this day"),
                    "limit": schema.integer(
                        "At most this many tasks.", minimum=1, maximum=SEARCH_LIMIT_MAX, default=20
                    ),
                }
            ),
            handler=task_search,
            outside=_outside,
            read_only=True,
        ),
        Skill(
            name="tasks.create",
            description="Add a task to the user's list.",
            parameters=schema.params(
                {"title": _TITLE, "notes": _NOTES, "due": schema.date("Due day")},
                required=("title",),
            ),
            handler=task_create,
            outside=_outside,
            effect=lambda arguments, result: f"created task “{result['task']['title']}”",
        ),
        Skill(
            name="tasks.update",
            description="Change a task's title, notes or due day (due null clears it).",
            parameters=schema.params(
                {
                    "task_id": schema.record_id("task"),
                    "title": _TITLE,
                    "notes": _NOTES,
                    "due": schema.date("Due day", nullable=True),
                },
                required=("task_id",),
            ),
            handler=task_update,
            outside=_outside,
            effect=lambda arguments, result: f"changed task “{result['task']['title']}”",
        ),
        Skill(
            name="tasks.complete",
            description="Mark a task done (doing it twice is harmless).",
            parameters=schema.params({"task_id": schema.record_id("task")}, required=("task_id",)),
            handler=task_complete,
            outside=_outside,
            effect=lambda arguments, result: f"completed task “{result['task']['title']}”",
        ),
    ),
)
