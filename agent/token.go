package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// tokenFile is gRPC per-RPC credentials sending the token held in a file as
// "authorization: Bearer <token>". The file is read on every call (every stream opened), so
// a projected ServiceAccount token that the kubelet rotates is picked up at the next connect.
type tokenFile string

// GetRequestMetadata reads the token; it errors when the file cannot be read or is empty.
func (f tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("read agent token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return nil, errors.New("read agent token: " + string(f) + " is empty")
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity is true: the token crosses the network only inside the stream's
// TLS, so it cannot be read off the wire and replayed.
func (tokenFile) RequireTransportSecurity() bool { return true }
