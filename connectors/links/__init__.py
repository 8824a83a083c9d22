"""Remote links: link keys, seed 002 push rules and drift, mapping revalidation, deletion and identity transfer."""
