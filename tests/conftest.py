# tests/site checks the BUILT site (a real browser, the link and label checks): `make site-test` runs it after
# `make book`. Left out of the main suite so that `make test` needs neither a build nor a browser, and never checks
# a stale _build/html. Naming the folder (`pytest tests/site`) still collects it.
collect_ignore = ["site", "hub"]
