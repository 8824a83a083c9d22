"""``make bench``: NexusFlow measured beside the database floor and django-q2 (:mod:`packs.bench.run`)."""
