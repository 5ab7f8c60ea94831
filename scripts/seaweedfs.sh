#!/usr/bin/env bash
# Prints the path of SeaweedFS's `weed` (e2e/testenv/seaweedfs: its Go module, pinned), the
# S3-compatible object store the backup tests run on loopback, building it first if the
# cache has none (once per machine; see scripts/go-tool.sh).
exec bash "$(dirname "$0")/go-tool.sh" seaweedfs e2e/testenv/seaweedfs github.com/seaweedfs/seaweedfs/weed
