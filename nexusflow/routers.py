"""Route the cutover decision journal to the ``control`` database.

ARCHITECTURE.md section 7: restoring the main database never rewrites the
activation-versus-restore decision, so those models live on their own alias.
Models opt in with ``nexus_database = "control"`` on their class.
"""
from __future__ import annotations

CONTROL = "control"


def _wanted(model) -> str:
    return getattr(model, "nexus_database", "default")


class ControlDatabaseRouter:
    def db_for_read(self, model, **hints):
        return _wanted(model)

    def db_for_write(self, model, **hints):
        return _wanted(model)

    def allow_relation(self, obj1, obj2, **hints):
        return _wanted(type(obj1)) == _wanted(type(obj2))

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        model = hints.get("model")
        if model is not None:
            return _wanted(model) == db
        if db == CONTROL:
            # Only the cutover app carries control models; other apps stay off it.
            return app_label == "cutover"
        return True
