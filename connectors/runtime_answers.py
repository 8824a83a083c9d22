"""What the Connector answers through the Runtime's ports (``runtime_outbox/ports.py``), loaded on first use.

``ConnectorsConfig.ready`` registers these thin answers; each imports
:mod:`connectors.outbound.intents` only when the Runtime first asks, so loading the
app (a management command, the revalidation path) never loads the outbound
effect model (tests/connectors/links/test_push_revalidation.py).
"""
from __future__ import annotations


def freeze_push_binding(**kwargs) -> dict:
    """:func:`connectors.outbound.intents.freeze_push_binding` (same arguments, result and errors)."""
    from connectors.outbound.intents import freeze_push_binding as freeze

    return freeze(**kwargs)


def delivery_contract_for(**kwargs):
    """:func:`connectors.outbound.intents.delivery_contract_for` (same arguments, result and errors)."""
    from connectors.outbound.intents import delivery_contract_for as read

    return read(**kwargs)


def predecessor_effect_read(**kwargs):
    """:func:`connectors.outbound.intents.predecessor_effect_read` (same arguments, result and errors)."""
    from connectors.outbound.intents import predecessor_effect_read as read

    return read(**kwargs)


def no_effect_unsettled_attempt(**kwargs) -> int | None:
    """:func:`connectors.outbound.intents.no_effect_unsettled_attempt` (same arguments, result and errors)."""
    from connectors.outbound.intents import no_effect_unsettled_attempt as unsettled

    return unsettled(**kwargs)
