"""Storage: the artifact type, its on-disk format and checksums, the registries, id maps."""
