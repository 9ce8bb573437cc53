-- The secret that seals continue tokens (internal/store/page.go): one row,
-- shared by every replica of the database, so a token made by one replica
-- is accepted by all of them and a forged or altered token by none. It is
-- made here from PostgreSQL's strong random source (gen_random_uuid, 122
-- random bits each, hashed into 32 bytes); a replica that finds the row
-- missing inserts one of its own (ON CONFLICT DO NOTHING: the first wins).
-- Deleting the row invalidates every token in circulation once replicas
-- restart.

-- +goose Up
CREATE TABLE page_token_key (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret     bytea NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO page_token_key (secret)
VALUES (sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')));

-- +goose Down
DROP TABLE page_token_key;
