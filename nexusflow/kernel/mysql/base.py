"""Django's MySQL backend, opening each ``transaction.atomic()`` with ``START TRANSACTION``.

Django's own backend starts a transaction by turning the session's autocommit
off (``SET autocommit=0``) and, after the ``COMMIT`` or ``ROLLBACK``, turns it
on again (``SET autocommit=1``): three statements around every transaction,
about 35 of the 300 statements of a confirmed effect (docs/performance.md
"The main job at a durable peer's speed: the design"). This backend leaves the
session in autocommit and opens the transaction with ``START TRANSACTION``
instead (Django's hook for it, ``_start_transaction_under_autocommit``, which
``atomic()`` asks for); the ``COMMIT`` or ``ROLLBACK`` that ends it returns the
session to autocommit by itself, so turning autocommit back on needs no
statement. The transaction is the same InnoDB transaction at the same
isolation level (READ COMMITTED), with the same locks and savepoints; only the
two ``SET`` statements go.

Turning autocommit off by hand (``transaction.set_autocommit(False)``, outside
``atomic()``) still runs ``SET autocommit=0`` as before, and a new connection
is put in autocommit by ``SET autocommit=1`` as before (mysqlclient connects
with autocommit off).
"""
from __future__ import annotations

from django.db.backends.mysql import base


class DatabaseWrapper(base.DatabaseWrapper):
    """``django.db.backends.mysql`` with transactions opened by ``START TRANSACTION`` (module docstring)."""

    #: True while a transaction opened by :meth:`_start_transaction_under_autocommit` is (or was last) open.
    _began_under_autocommit = False

    def get_new_connection(self, conn_params):
        self._began_under_autocommit = False  # a new session: autocommit is set for real at connect
        return super().get_new_connection(conn_params)

    def _start_transaction_under_autocommit(self):
        with self.wrap_database_errors:
            self.connection.query("START TRANSACTION")
        self._began_under_autocommit = True

    def _set_autocommit(self, autocommit):
        if autocommit and self._began_under_autocommit:
            # The COMMIT or ROLLBACK that ended the transaction returned the session to autocommit.
            self._began_under_autocommit = False
            return
        self._began_under_autocommit = False
        super()._set_autocommit(autocommit)
