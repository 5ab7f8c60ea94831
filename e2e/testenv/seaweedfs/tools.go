//go:build tools

// The backups' S3-compatible object store in the tests: SeaweedFS (`weed server -s3`),
// built from its Go module (scripts/seaweedfs.sh).
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
