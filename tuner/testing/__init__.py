"""Test-support code shipped with the package (the tiny model generator, stand-in servers)."""
