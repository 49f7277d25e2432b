"""Serving: the gRPC servicer and server, the HTTP port, security, metrics, the CLI."""
