"""The inbound chain: admission, executions on ordering lanes, windows, replay, pulled streams, the ingress API."""
