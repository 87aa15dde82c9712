"""rollstream's library: everything below orchestration.

Stages talk only through the campaign folder (see ``storage``). Nothing in this package imports
Prefect; every function runs from a REPL or a test.
"""
