//go:build tools

// The NATS server (with JetStream) the NATS sink's tests and the `nats` bench publish to,
// built from its module: scripts/nats-server.sh.
package tools

import _ "github.com/nats-io/nats-server/v2"
