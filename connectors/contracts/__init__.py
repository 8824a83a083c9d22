"""Pure pack-data contracts: validators and interpreters of what a pack declares, no database access."""
