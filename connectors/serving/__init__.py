"""Serving authority: account gates, ServingEpochs, immutable generations, successor handoff, credential gates."""
