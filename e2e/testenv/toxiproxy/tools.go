//go:build tools

// The partition suite's proxy between relay nodes: Toxiproxy's server, built from its Go
// module (scripts/toxiproxy.sh).
package tools

import _ "github.com/Shopify/toxiproxy/v2/cmd/server"
