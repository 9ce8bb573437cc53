package store

import (
	"encoding/base64"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Continue tokens are the last key of the previous page, base64url-encoded:
// opaque to clients, stable across replicas, and cheap (keyset pagination
// on an index, never OFFSET).

func encodeContinue(lastKey string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(lastKey))
}

func decodeContinue(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) == 0 {
		return "", alloc.Invalid("continue", "not a continue token from this API")
	}
	return string(b), nil
}

// pageOf trims a result fetched with limit+1 rows to limit and returns the
// token of the next page, if any.
func pageOf[T any](items []T, limit int, key func(T) string) ([]T, string) {
	if len(items) <= limit {
		return items, ""
	}
	items = items[:limit]
	return items, encodeContinue(key(items[limit-1]))
}
