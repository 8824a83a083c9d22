"""Route the cutover decision journal to the ``control`` database.

ARCHITECTURE.md section 7: restoring the main database never rewrites the
activation-versus-restore decision, so those models live on their own alias.
The V1RestorePoint receipt and the RestoreAttempt journal live there too (seed 003 step 6: durable outside the
database being restored). The set below is the whole list; migrations see historical models, so the
router decides by ``(app_label, model_name)``, not by class attributes.
"""
from __future__ import annotations

CONTROL = "control"
CONTROL_MODELS = frozenset({("cutover", "cutoverdecision"), ("cutover", "v1restorepoint"), ("cutover", "restoreattempt")})


def _db_of(app_label: str, model_name: str | None) -> str:
    return CONTROL if (app_label, (model_name or "").lower()) in CONTROL_MODELS else "default"


class ControlDatabaseRouter:
    def db_for_read(self, model, **hints):
        return _db_of(model._meta.app_label, model._meta.model_name)

    def db_for_write(self, model, **hints):
        return _db_of(model._meta.app_label, model._meta.model_name)

    def allow_relation(self, obj1, obj2, **hints):
        return self.db_for_read(type(obj1)) == self.db_for_read(type(obj2))

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if model_name is None:
            return db == "default"
        return _db_of(app_label, model_name) == db
