"""Tools around the service: the load generator and the server-process harness.

Not part of the runtime: ``ordrec.service`` never imports them.
"""
