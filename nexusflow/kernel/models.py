"""Model bases that only stores can write (CONVENTIONS.md "Persistence").

``GuardedModel.save()``/``delete()`` and the queryset writers ``update()``,
``delete()``, ``bulk_create()``, ``bulk_update()``, ``get_or_create()`` and
``update_or_create()`` raise :class:`ImmutableRow`. A store inserts through :func:`insert` and
changes state only through :class:`nexusflow.kernel.store.CasStore`.
"""
from __future__ import annotations

from django.db import models

from .errors import ImmutableRow


class GuardedQuerySet(models.QuerySet):
    """A queryset that reads but never writes: every ORM write path raises ImmutableRow."""

    def update(self, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk update outside its store")

    def delete(self):
        raise ImmutableRow(f"{self.model.__name__}: delete outside its store")

    def bulk_create(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk_create outside its store")

    def bulk_update(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk_update outside its store")

    def get_or_create(self, *args, **kwargs):
        # May insert: a store inserts through ``insert`` after its own existence check.
        raise ImmutableRow(f"{self.model.__name__}: get_or_create outside its store")

    def update_or_create(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: update_or_create outside its store")


class GuardedModel(models.Model):
    """A row written only through its app's store."""

    objects = GuardedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not (self._state.adding and getattr(self, "_nexus_store_insert", False)):
            raise ImmutableRow(f"{type(self).__name__}.save() outside its store")
        self._nexus_store_insert = False
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableRow(f"{type(self).__name__}.delete() is not allowed")


def insert(model_cls, **values):
    """Insert one row of a :class:`GuardedModel` and return it."""
    obj = model_cls(**values)
    obj._nexus_store_insert = True
    obj.save(using=model_cls.objects.db)
    return obj


def reason_code_field():
    """The ``reason_code`` column: a registered code from ``<app>/reasons.py``, or empty."""
    return models.CharField(max_length=64, blank=True, default="",
                            help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.")


def reason_code_constraint(machine, *, name: str) -> models.CheckConstraint:
    """A CHECK that rows in ``machine.reason_required`` states carry a non-empty ``reason_code``.

    Args:
        machine: the model's :class:`nexusflow.kernel.transitions.StateMachine`.
        name: the constraint name (unique in the database).

    Seed 003, "Operational liveness and maintenance admission".
    """
    return models.CheckConstraint(
        condition=~models.Q(state__in=sorted(machine.reason_required)) | ~models.Q(reason_code=""), name=name)
