"""``manage.py connector_pack_publish PATH...``: publish immutable pack generations."""
from django.core.management.base import CommandError

from connectors.serving.generations import pack_generation_read, pack_publish, pack_read_file
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError


class Command(OperatorCommand):
    help = ("Publish each pack.json as an immutable PackGeneration with its Catalog bindings (inbound routes, "
            "callout profiles, field mappings, push contracts). The same bytes again are a no-op; other content "
            "under a published pack key and version is refused (exit 1, 'CommandError: pack_version_conflict: ...'). "
            "Every file is read and validated before any is published: one bad file publishes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", help="pack.json files.")

    def handle(self, *args, paths, **options):
        try:
            documents = [(path, pack_read_file(path)) for path in paths]
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        for path, document in documents:
            try:
                generation, created = pack_publish(document=document, source=str(path))
                read = pack_generation_read(generation.pk)
            except NexusError as exc:
                raise CommandError(f"{exc.code}: {exc}") from exc
            kinds = {}
            for binding in read.bindings:
                kinds[binding.kind] = kinds.get(binding.kind, 0) + 1
            summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "no bindings"
            self.stdout.write(f"pack {generation.pack_key} {generation.version}: generation {generation.pk} "
                              f"{'published' if created else 'already published'} (payload {generation.digest[:16]}, "
                              f"receipt {read.receipt.owner_digest[:16]}; {summary})")
