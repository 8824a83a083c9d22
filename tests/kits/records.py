"""Source records for tests: create Contacts of ``ORG`` the way an application save does, read the one record.

Every helper goes through the records services (``record_create``) in its
own transaction; nothing here writes a row directly.
"""
from __future__ import annotations

from django.db import transaction

from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_create
from tests.conftest import ORG


def create_record(object_name: str, **values: str | None) -> Record:
    """Create one ``object_name`` record of ``ORG`` holding exactly ``values``; return it.

    Raises:
        UnknownField, InvalidFieldValue: ``values`` do not fit the object's metadata.
    """
    with transaction.atomic():
        return record_create(org=OrgScope(ORG), object_name=object_name, values=values)


def create_contact(**values: str | None) -> Record:
    """Create one Contact of ``ORG`` holding exactly ``values`` (no field is added); return it."""
    return create_record("Contact", **values)


def contact_of(email: str = "ann@x.io", **values: str | None) -> Record:
    """Create a Contact for ``email`` whose ``firstname`` is its local part title-cased (``ann@x.io`` -> ``Ann``).

    ``values`` add fields (a ``firstname`` replaces the derived one; a ``None`` value is stored as such).
    """
    return create_contact(**{"email": email, "firstname": email.split("@")[0].title(), **values})


def customer_contact(email: str = "ann@x.io", **values: str | None) -> Record:
    """Create a customer Contact: :func:`contact_of` with ``lifecyclestage`` ``customer`` (``values`` win)."""
    return contact_of(email, **{"lifecyclestage": "customer", **values})


def only_record() -> Record:
    """The one record in the database (inbound tests that admitted one object).

    Raises:
        Record.DoesNotExist, Record.MultipleObjectsReturned: not exactly one record.
    """
    return Record.objects.get()
