"""The peer's unit of work: a django-q2 task that does nothing (its cost is the queue's own)."""


def noop() -> None:
    """A no-op task for the django-q2 series of ``make bench``."""
    return None
