"""Outbound: intents into one RemoteEffect, the Runtime inbox, the sole egress adapter, operator decisions."""
