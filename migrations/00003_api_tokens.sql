-- API tokens for people and automation (issue 5, authentication and roles).
-- Only the SHA-256 of a token's secret is stored: the secret is 32 random
-- bytes, so a fast hash is enough (nothing to brute-force) and lets every
-- request be checked with one index lookup. Revoked tokens stay as rows for
-- the record; only the live ones hold their name.

-- +goose Up
CREATE TABLE api_tokens (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- A DNS label (checked by the service), the identity in logs, rate
    -- limits and the address history ("token:NAME").
    name          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 63),
    -- Node identities come from certificates only; a token is never a node.
    role          text NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
    secret_sha256 bytea NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    created_at    timestamptz NOT NULL,
    -- Who created it: "token:NAME", "cert:CN", "bootstrap" or "cli".
    created_by    text NOT NULL,
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    -- Updated at most once a minute per token, so that using a token costs
    -- a write only rarely.
    last_used_at  timestamptz,
    CHECK (expires_at > created_at),
    CHECK (revoked_at IS NULL OR revoked_at >= created_at)
);
-- One live (not revoked) token per name; an expired one keeps its name
-- until it is revoked, so a name never silently changes hands.
CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (name) WHERE revoked_at IS NULL;

-- +goose Down
DROP TABLE api_tokens;
