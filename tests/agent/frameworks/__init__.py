"""Jobs of the framework integration tests (importable: the launcher spawns processes)."""
